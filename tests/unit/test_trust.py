"""What a member can do to an island, and what an island does to itself when it diverges.

Plausibility of partner states (`peers/admission/plausibility.py`), refusals that drop a partner
(`peers/gossip/partners.py`), and the rollback of a diverged island (`peers/rounds/divergence.py`) through the
public API, in one process. The swarm-level attacks (a hostile member among honest ones, as
processes) are measured by `p2p-diloco bench attack` (BENCHMARKS.md).
"""

import math

import pytest
import torch

from p2p_diloco.core import codecs
from p2p_diloco.peers.gossip.partners import REFUSALS_TO_DROP, SET_ASIDE_S, PartnerChooser
from p2p_diloco.peers.admission.plausibility import PlausibilityGate
from p2p_diloco.peers.gossip.measure import relative_distance


pytestmark = pytest.mark.timeout(60)


def test_relative_distance_reads_encoded_states_slice_by_slice():
    own = torch.randn(3_000_001)
    theirs = own + 0.01 * torch.randn_like(own)
    enc = codecs.EncodedVector(codecs.encode(theirs, "int8"), "int8", theirs.numel())
    plain = relative_distance(own, codecs.roundtrip(theirs, "int8"))
    assert relative_distance(own, enc) == pytest.approx(plain, rel=1e-9)
    assert relative_distance(own, own * 1e6) == pytest.approx(1e6 - 1, rel=1e-6)


def test_the_gate_refuses_what_no_honest_partner_sends_and_nothing_nearer():
    gate = PlausibilityGate()
    own = torch.randn(10_000) * 0.02
    attacks = {"scaled x1e6": own * 1e6, "random": torch.randn_like(own) * own.std(),
               "another run": torch.randn_like(own) * 0.02 + 0.001 * torch.randn_like(own)}
    for name, state in attacks.items():
        assert gate.judge_distance(relative_distance(own, state)) is not None, name
    # honest partners however far apart they trained (a link down for long), an anchor x1.5: admitted,
    # and bounded by the checks after it (`clip`, `trust`)
    for state in (own + 0.001 * torch.randn_like(own), own + 0.015 * torch.randn_like(own), own * 1.5):
        assert gate.judge_distance(relative_distance(own, state)) is None
    assert gate.judge_distance(float("nan")) is not None and gate.judge_distance(None) is None


def test_a_partner_refused_again_and_again_is_set_aside_for_longer_each_time_not_for_ever():
    now = [0.0]
    c = PartnerChooser("me", clock=lambda: now[0])
    assert all(c.refused("bad") is None for _ in range(REFUSALS_TO_DROP - 1))
    assert c.refused("bad") == SET_ASIDE_S and c.shunned("bad") and "bad" not in c.excluded
    now[0] = SET_ASIDE_S + 1  # an attack that pushed two honest islands apart is over: they mix again
    assert not c.shunned("bad")
    assert all(c.refused("bad") is None for _ in range(REFUSALS_TO_DROP - 1))
    assert c.refused("bad") == 4 * SET_ASIDE_S
    c.mixed("good")
    c.refused("good"), c.refused("good"), c.mixed("good")  # refusals in a row: a mixed state starts them over
    assert c.refused("good") is None and not c.shunned("good")


def test_a_diverging_island_rolls_back_to_its_anchor_and_never_checkpoints_nan(tmp_path):
    from test_api import Tiny, lone_island

    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with lone_island(tmp_path, model, opt, max_rounds=3) as island:
        island.step(loss=1.0)
        anchor = island.outer.state.phi.clone()
        with torch.no_grad():
            model.head.weight.fill_(float("nan"))  # what a user's diverged step leaves behind
        island.step(loss=float("nan"))  # non-finite weights: rolled back at once
        assert island.guard.rollbacks == 1 and torch.equal(island.outer.params_vector(), anchor)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.05) and not opt.state
        assert island.last_loss is None and island.record().loss is None  # a record carries finite numbers only
        for _ in range(3):  # three non-finite losses in a row (the weights finite): rolled back again
            island.step(loss=torch.tensor(float("inf")))
        assert island.guard.rollbacks == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.025)
        while not island.done:
            island.step(loss=0.5)
    assert island.save_checkpoint() is not None
    assert all(math.isfinite(v) for v in island.outer.state.phi.tolist())


def test_a_resumed_time_bounded_island_keeps_its_learning_rate_schedule():
    """The schedule is sized from the first round's speed once; a resumed island (round > 0) keeps the
    one its checkpoint restored instead of sizing it again from a few seconds of timing."""
    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.core.data import BatchSampler
    from p2p_diloco.core.model import build_model
    from p2p_diloco.peers.launch.runner import Trainer, train

    class ResumedIsland:
        round, done, inner_seconds, steps = 4, False, 1e-3, 0

        def step(self, loss=None, tokens=None):
            self.steps += 1
            self.done = self.steps >= 2

        def share(self, value):
            return value

    model = build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))
    trainer = Trainer(model, TrainConfig(batch_size=2, total_steps=777))
    trainer.sampler = BatchSampler(torch.randint(0, 256, (4096,), dtype=torch.uint8), 8, 2, seed=0)
    train(ResumedIsland(), trainer, max_seconds=3600, size_by_time=True)
    assert trainer.inner.cfg.total_steps == 777


def test_a_joiner_adopts_the_state_the_freshest_members_agree_on():
    """A member claiming the highest version with a poisoned state does not become every newcomer's start."""
    from p2p_diloco.core.outer import PartnerState
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.peers.state.source import Downloaded, _most_central

    def got(name, phi):
        return Downloaded(IslandRecord(peer_id=name, endpoint="tcp://127.0.0.1:1"), PartnerState(phi=phi, m=None, version=9, tokens=9), 0, 0.0)

    initial = torch.randn(50_000) * 0.02
    honest = [initial + 0.01 * torch.randn_like(initial) for _ in range(2)]
    poisoned = initial * 1e6
    hostile, a, b = got("hostile", poisoned), got("a", honest[0]), got("b", honest[1])
    assert _most_central([hostile, a, b], initial).record.peer_id in ("a", "b")
    assert _most_central([hostile, a], initial).record.peer_id == "a"  # two: the one closer to the initial weights
    assert _most_central([a], initial).record.peer_id == "a"
