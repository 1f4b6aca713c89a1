"""The bounds of `core.influence` on islands that trained: what each of a member's poisons meets.

Two islands of a small model train a few rounds from the same weights, mixing each other's states;
then each kind of state a broken or hostile member publishes (`bench member --poison`) is measured
against one of them as a partner's state arriving is (`peers.gossip.measure.measure`) and judged as
the island's admission judges it (`peers.admission`, every check in the default order).
"""

import statistics
from types import SimpleNamespace

import pytest
import torch

from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.admission import AdmissionConfig, BoundsSettings, TrustSettings
from p2p_diloco.core.influence import InfluenceBound
from p2p_diloco.core.island import Island
from p2p_diloco.core.model import build_model
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.peers.admission.admission import Admission
from p2p_diloco.peers.gossip.measure import measure
from p2p_diloco.peers.admission.protocol import Candidate
from p2p_diloco.peers.admission.registry import build_checks
from p2p_diloco.peers.identity import Identity

SNAP = SimpleNamespace(meta={}, endpoint="tcp://b")
"""The snapshot a state came in, as the `identity` check reads it (a manifest naming no model or run)."""
BOUNDS = BoundsSettings()
CLIP, MOMENTUM_CLIP = BOUNDS.clip, BOUNDS.momentum_clip

ROUNDS = 6


def _island(name: str, seed: int) -> Island:
    torch.manual_seed(0)  # the same initial weights, other data
    model = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16))
    data = torch.randint(0, 256, (1 << 14,), generator=torch.Generator().manual_seed(seed), dtype=torch.int64).to(torch.uint8)
    return Island(name, model, TrainConfig(batch_size=4, warmup_steps=0, lr=3e-3), DiLoCoConfig(local_steps=5),
                  BatchSampler(data, 16, 4, seed=seed))


@pytest.fixture(scope="module")
def trained():
    """Two islands after `ROUNDS` rounds of mixing each other's states, and their initial weights;
    the anchor and momentum of the second before its last round (what `reverse` needs)."""
    a, b = _island("a", 1), _island("b", 2)
    initial = a.state.phi.clone()
    before = None
    for _ in range(ROUNDS):
        for isl in (a, b):
            for _ in range(isl.cfg.local_steps):
                isl.inner_step()
        sa, sb = a.state.clone(), b.state.clone()
        before = sb.phi.clone()
        a.end_round([PartnerState(sb.phi, sb.m, sb.version, sb.tokens)])
        b.end_round([PartnerState(sa.phi, sa.m, sa.version, sa.tokens)])
    return a, b, initial, before


def _judge(island: Island, phi: torch.Tensor, m: torch.Tensor | None = None, version: int | None = None):
    """Why `island` refuses this state (None: it does not), what it measured, and the weight it
    would mix it with."""
    admission = admission_of(island)
    state = PartnerState(phi, m, island.state.version if version is None else version, island.state.tokens)
    measured = measure(island.state.phi, phi, island.state.m, m)
    folded = admission.fold(Candidate("b", SNAP, state, measured))
    return (None if folded.refusal is None else folded.refusal.refused), measured, folded.weight


def admission_of(island: Island) -> Admission:
    """The admission `island` would run with the default checks (no probe)."""
    return Admission(build_checks(AdmissionConfig(), island), Identity("a", "a", "", ""), island, None, None, dict)


def test_an_honest_partner_passes_and_its_mix_is_not_cut(trained):
    a, b, _, _ = trained
    why, measured, weight = _judge(a, b.state.phi, b.state.m)  # judged by the start bound
    assert why is None and weight == pytest.approx(0.5)
    assert weight * measured.gap <= CLIP * a.progress()  # the honest mix sits inside the bound


def test_what_no_partner_sends_is_refused_and_every_other_state_moves_the_island_a_bounded_amount(trained):
    """The refusals are for what no honest partner sends (a momentum beyond what pseudo-gradients sum
    to, a state as far as the weights are large); every other poison is admitted with its move clipped
    around the island's own state at `CLIP` rounds of its progress."""
    a, b, initial, before = trained
    phi, m = b.state.phi, b.state.m
    assert "implausible momentum" in _judge(a, phi, m * 1e4)[0]
    assert "implausible" in _judge(a, phi * 1e6, m)[0]
    assert "implausible" in _judge(a, torch.randn_like(phi) * phi.std(), m)[0]
    honest = measure(a.state.phi, phi).distance
    noise = torch.randn(phi.numel(), generator=torch.Generator().manual_seed(0))
    for poison in (phi * 1.5, initial, 2 * before - phi, phi + noise * (4 * honest * a.state.phi.norm() / noise.norm())):
        why, measured, weight = _judge(a, poison, m)
        assert why is None and weight * measured.trained <= CLIP * a.progress() * (1 + 1e-6)


def test_honest_partners_however_far_apart_are_mixed_their_move_clipped(trained):
    """Two honest islands that trained apart (a link down, a partition) mix again as soon as a state
    arrives, never refused: the move at most `CLIP` rounds (less where it sits far back: `trust`)."""
    a, b, initial, _ = trained
    for apart in (1.5, 3.0):  # the partner's difference from the island, scaled (at 3: 0.8 x its weights away)
        phi = a.state.phi + apart * (b.state.phi - a.state.phi)
        why, measured, weight = _judge(a, phi, b.state.m)
        assert why is None and weight > 0 and weight * measured.trained <= CLIP * a.progress() * (1 + 1e-6)


def test_a_partner_whose_states_keep_sitting_back_along_the_progress_loses_weight(trained):
    """The trust record: states that sit back along the island's progress, beyond where an honest one
    reaches and beyond their lag, time after time, are mixed ever more lightly; honest ones as they come."""
    a, b, initial, before = trained
    admission = admission_of(a)
    for _ in range(6):  # the swarm's typical place: honest states
        folded = admission.fold(Candidate("honest", SNAP, PartnerState(b.state.phi, b.state.m, a.state.version,
                                                                        a.state.tokens),
                                          measure(a.state.phi, b.state.phi, a.state.m, b.state.m)))
        assert folded.refusal is None and "bounded" not in folded.figures
    back = a.state.phi + a.state.m / a.state.m.norm() * 3 * statistics.median(a.influence.advances)  # 3 rounds back
    weights = []
    for _ in range(3):
        folded = admission.fold(Candidate("back", SNAP, PartnerState(back, b.state.m, a.state.version, a.state.tokens),
                                          measure(a.state.phi, back, a.state.m, b.state.m)))
        assert folded.refusal is None
        weights.append(folded.weight)
    # the first is bounded already: it takes the island back at most `step` rounds beyond what an honest one does
    assert weights[0] * (3 - TrustSettings().behind) <= TrustSettings().step * (1 + 1e-6)
    assert admission.ledger["back"].record > 1.5 and weights[-1] < 0.1 and weights[-1] <= weights[0] * 1.01
    assert admission.ledger["honest"].record <= TrustSettings().slack


def test_a_public_state_is_measured_by_the_share_of_its_difference_a_mix_takes():
    """Updates in fragments are mixed a share at a time (`core.public.mixed_share`), and their bounds
    judge that share: the public states' staggered turns put up to `parts` rounds of each side's lag
    in their difference. The gate's distance stays the whole difference, as it learned every other."""
    g = torch.Generator().manual_seed(0)
    anchor, own_pub, their_pub = (torch.randn(1000, generator=g) for _ in range(3))
    whole, quarter = measure(anchor, their_pub, base=own_pub), measure(anchor, their_pub, base=own_pub, share=0.25)
    assert quarter.gap == pytest.approx(whole.gap / 4, rel=1e-6)
    assert quarter.norm == pytest.approx(float((anchor + (their_pub - own_pub) / 4).norm()), rel=1e-5)
    assert quarter.distance == whole.distance  # (the gate learns every state's whole difference)
    m = torch.randn(1000, generator=g)
    along = measure(anchor, their_pub, m, base=own_pub, share=0.25).along
    assert along == pytest.approx(float(((their_pub - own_pub) / 4 @ m) / m.norm()), rel=1e-5)


def test_the_weight_is_cut_to_the_bound():
    bound = InfluenceBound(outer_momentum=0.5)
    assert bound.clip(gap=10.0, d=None) == 1.0  # nothing to learn from yet
    assert bound.clip(gap=1.0, d=1.0) == 1.0
    assert bound.clip(gap=10.0, d=1.0) == pytest.approx(CLIP / 10.0)


def test_the_weight_is_decided_once_by_the_admission_and_a_cut_one_is_counted_as_bounded(trained):
    """The island mixes with the weight its admission decided (`PartnerState.cap`), never more; a weight
    a check cut below the base weight is reported as `bounded` and counted."""
    a, b, _, _ = trained
    state = b.state
    assert a.weight(PartnerState(state.phi, state.m, a.state.version, a.state.tokens, cap=0.125)) == 0.125
    admission = admission_of(a)
    honest = measure(a.state.phi, state.phi).distance
    noise = torch.randn(state.phi.numel(), generator=torch.Generator().manual_seed(0))
    noisy = state.phi + noise * (4 * honest * a.state.phi.norm() / noise.norm())
    far = measure(a.state.phi, noisy, a.state.m, state.m)
    folded = admission.fold(Candidate("b", SNAP, PartnerState(noisy, state.m, a.state.version, a.state.tokens), far))
    assert folded.refusal is None and folded.base == 0.5
    assert folded.weight == pytest.approx(CLIP * a.progress() / far.trained, rel=1e-6) and folded.weight < 0.5
    assert folded.figures["bounded"] and admission.counts["bounded"] == 1


def test_before_its_first_outer_step_an_island_measures_its_progress_so_far():
    isl = _island("c", 3)
    assert isl.progress() is None  # no step at all: the gate's fixed start bound applies
    for _ in range(2):
        isl.inner_step()
    partial = (isl.state.phi - isl.params_vector()).norm().item()
    assert isl.progress() == pytest.approx(partial * isl.cfg.local_steps / 2, rel=1e-4)
    isl.end_round([])
    assert isl.influence.reference() is not None and isl.progress() == isl.influence.reference()


def test_a_joiner_takes_the_scale_of_a_round_from_the_state_it_adopted(trained):
    """A joiner's first rounds (warmup, fresh inner moments) move it little; measured from them, its
    bounds would refuse the momentum of the swarm it joined. It reads a round's progress from the
    momentum it adopted until its own rounds replace it."""
    a = trained[0]
    joiner = _island("j", 4)
    joiner.adopt(PartnerState(a.state.phi.clone(), a.state.m.clone(), a.state.version, a.state.tokens), joined=True)
    d = joiner.progress()
    assert d == pytest.approx(a.state.m.norm().item() * (1 - joiner.cfg.outer_momentum**2) ** 0.5, rel=1e-5)
    why, _, weight = _judge(joiner, a.state.phi.clone(), a.state.m.clone())
    assert why is None and weight > 0
    joiner.adopt(PartnerState(a.state.phi.clone(), torch.zeros_like(a.state.m), a.state.version, a.state.tokens), joined=True)
    assert joiner.progress() == pytest.approx(d)  # (a state without momentum says nothing of a round)


def test_the_rounding_of_an_encoded_state_is_estimated_from_its_scales():
    """What int8 rounds off a state is part of every distance, and no partner's training: measured
    from the scales alone, it matches the real rounding error."""
    from p2p_diloco.core import codecs

    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(0)) * 0.02
    for codec in ("int8", "int4"):
        enc = codecs.EncodedVector(codecs.encode(x, codec), codec, x.numel())
        real = (x - codecs.roundtrip(x, codec)).norm().item()
        assert codecs.rounding_error(enc) == pytest.approx(real, rel=0.05)
        assert codecs.rounding_error(enc[: x.numel() // 2]) == pytest.approx(real / 2 ** 0.5, rel=0.05)
    assert codecs.rounding_error(codecs.EncodedVector(codecs.encode(x, "fp32"), "fp32", x.numel())) == 0.0


def test_a_momentum_x3_passes_the_order_of_magnitude_bound_and_is_mixed_at_the_learned_one(trained):
    a, b, _, _ = trained
    honest, tripled = float(b.state.m.norm()), 3 * float(b.state.m.norm())
    assert a.influence.momentum(tripled, a.progress()) is None  # within 3 D / (1 - mu)
    assert a.influence.momentum_scale(honest) == 1.0  # the honest partner's, as it came
    scale = a.influence.momentum_scale(tripled)
    assert scale * tripled == pytest.approx(MOMENTUM_CLIP * max(statistics.median(a.influence.momenta),
                                                                a.influence.momenta[-1]))
