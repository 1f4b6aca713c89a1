"""`peers.admission.probe`: a partner's mix judged by its effect on a held-out loss, its weight cut to keep it.

Two islands of a small model train a few rounds on two parts of one text, mixing each other's
states; a third part is held out. Mid-round, the first island probes an honest partner's state and
the state of a stuck member (its initial weights).
"""

from types import SimpleNamespace

import pytest
import torch

from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler, load_corpus
from p2p_diloco.core.inner import evaluate
from p2p_diloco.core.island import Island
from p2p_diloco.core.model import build_model
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.admission import ProbeSettings
from p2p_diloco.peers.admission.probe import EffectProbe

FLOOR, ROUNDS, START, WINDOW = ProbeSettings().floor, ProbeSettings().rounds, ProbeSettings().start, ProbeSettings().window

TRAINED = 6
TEXT = load_corpus(max_bytes=1_000_000).train[:60_000]  # the embedded corpus: fixed, unlike the docs
PART = TEXT.numel() // 3


def _island(name: str, part: int) -> Island:
    torch.manual_seed(0)  # the same initial weights, other data
    model = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32))
    data = TEXT[part * PART:(part + 1) * PART]
    return Island(name, model, TrainConfig(batch_size=8, warmup_steps=0, lr=3e-3), DiLoCoConfig(local_steps=5),
                  BatchSampler(data, 32, 8, seed=part))


@pytest.fixture(scope="module")
def trained():
    """After `TRAINED` rounds of mixing: the two islands, their initial weights, and a probe of the
    first on the held-out part, two steps into a round."""
    a, b = _island("a", 0), _island("b", 1)
    initial = a.state.phi.clone()
    for _ in range(TRAINED):
        for isl in (a, b):
            for _ in range(isl.cfg.local_steps):
                isl.inner_step()
        sa, sb = a.state.clone(), b.state.clone()
        a.end_round([PartnerState(sb.phi, sb.m, sb.version, sb.tokens)])
        b.end_round([PartnerState(sa.phi, sa.m, sa.version, sa.tokens)])
    for _ in range(2):
        a.inner_step()
    sampler = BatchSampler(TEXT[2 * PART:], 32, 16, seed=9)
    held_out = [sampler.next() for _ in range(2)]
    return a, b, initial, EffectProbe(a, lambda: evaluate(a.model, held_out))


def _state(island: Island, phi: torch.Tensor, m: torch.Tensor) -> PartnerState:
    return PartnerState(phi, m, island.state.version, island.state.tokens)


def test_an_honest_mix_is_left_as_it_is_and_stuck_training_s_is_cut(trained):
    """Judged at the tolerance of an island whose loss no longer falls (`FLOOR`)."""
    a, b, initial, probe = trained
    honest = probe.effect(_state(a, b.state.phi, b.state.m), 0.5)
    stuck = probe.effect(_state(a, initial, b.state.m), 0.5)
    now, loss = probe.seen[-1]
    probe.seen.appendleft((now - 1.0, loss))
    assert probe.tolerance() == FLOOR
    assert honest < FLOOR / 2 and probe.cut(honest, strikes=0) == 1.0
    assert stuck > 2 * FLOOR and probe.cut(stuck, strikes=0) == pytest.approx(FLOOR / stuck)
    stuck_state = _state(a, initial, b.state.m)
    assert probe.effect(stuck_state, 0.5 * FLOOR / stuck) <= FLOOR * 1.05  # about convex along the mix: the cut keeps the bound
    assert probe.cut(stuck, strikes=1) == pytest.approx(FLOOR / 2 / stuck)  # cut twice running: half the bound
    assert probe.cut(stuck, strikes=2) == pytest.approx(FLOOR / 4 / stuck)


def test_the_probe_s_cuts_in_a_row_are_the_ledger_s_strikes(trained):
    """As a check: a partner whose mixes it cut keeps a strike per cut in a row, and one it left as it
    was starts over."""
    from p2p_diloco.peers.admission.ledger import PartnerLedger
    from p2p_diloco.peers.admission.protocol import Candidate, Island

    a, b, initial, probe = trained
    island = Island(a, PartnerLedger(), None, dict, a.progress())
    stuck = Candidate("stuck", None, _state(a, initial, b.state.m), weight=0.5)
    honest = Candidate("stuck", None, _state(a, b.state.phi, b.state.m), weight=0.5)
    probe.seen.appendleft((probe.seen[-1][0] - 1.0, probe.seen[-1][1]))  # (a round seen: the floor applies)
    first, second = probe.judge(stuck, island), probe.judge(stuck, island)
    assert first.factor < 1 and second.factor == pytest.approx(first.factor / 2, rel=0.05)
    assert island.ledger["stuck"].strikes == 2 and "probe" in first.figures
    assert probe.judge(honest, island).factor == 1.0 and island.ledger["stuck"].strikes == 0


def test_the_tolerance_follows_the_island_s_own_progress():
    """Half of what a round lowers the probe loss by, lately; `FLOOR` at least; `START` until a round was seen."""
    outer = SimpleNamespace(state=SimpleNamespace(version=0), round_steps=0, cfg=SimpleNamespace(local_steps=10))
    probe = EffectProbe(outer, loss=lambda: 0.0)
    for version, loss in ((0, 3.0), (1, 2.7)):
        assert probe.tolerance() == START
        outer.state.version = version
        probe._saw(loss)
    assert probe.progress() == pytest.approx(0.3 / 2.7) and probe.tolerance() == pytest.approx(ROUNDS * 0.3 / 2.7)
    for version in range(2, 12):  # a plateau: the floor, measured over the last rounds only
        outer.state.version = version
        probe._saw(2.0)
    assert probe.progress() == 0.0 and probe.tolerance() == FLOOR
    assert probe.seen[-1][0] - probe.seen[0][0] <= WINDOW + 1


def test_the_probe_leaves_the_running_weights_and_the_anchor_as_they_were(trained):
    a, b, initial, probe = trained
    running, anchor = a.params_vector(), a.state.phi.clone()
    assert probe.effect(_state(a, initial * 3, b.state.m), 0.01) is not None
    assert torch.allclose(a.params_vector(), running, atol=1e-6) and torch.equal(a.state.phi, anchor)  # (no mix)


def test_nothing_to_judge_when_the_state_would_not_be_mixed(trained):
    a, b, _, probe = trained
    too_stale = PartnerState(b.state.phi, b.state.m, a.state.version - 100, a.state.tokens)
    assert probe.effect(too_stale, 0.0) is None and probe.cut(None, strikes=3) == 1.0


def test_the_probe_leaves_what_a_mix_did_for_the_partner_s_record(trained):
    """A mix that raised the held-out loss counts in its sender's record (`trust`), in the probe's
    tolerance, as at the base weight; one that lowered it counts 0."""
    from p2p_diloco.peers.admission.ledger import PartnerLedger
    from p2p_diloco.peers.admission.protocol import Candidate, Island

    a, b, initial, probe = trained
    island = Island(a, PartnerLedger(), None, dict, a.progress())
    probe.judge(Candidate("stuck", None, _state(a, initial, b.state.m), weight=0.5), island)
    probe.judge(Candidate("honest", None, _state(a, b.state.phi, b.state.m), weight=0.5), island)
    stuck, honest = island.ledger["stuck"].probed, island.ledger["honest"].probed
    assert stuck > 0.25 and stuck > 4 * honest, (stuck, honest)
