"""Members that lie quietly: claims counted only as far as they can be checked (`peers.admission.claims`), a
momentum mixed at most at a bound learned from the island's own (`core.influence`), and a memory of
what each partner's mixes moved the island (`peers.admission.drift`), judged as the island's admission judges them (`peers.admission`)."""

import pytest
import torch

from p2p_diloco.bench.attack import judged
from types import SimpleNamespace

from p2p_diloco.admission import BoundsSettings, ClaimsSettings, DriftSettings
from p2p_diloco.core.influence import InfluenceBound
from p2p_diloco.core.params import CHUNK
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.peers.admission.claims import ClaimsCheck, median_version
from p2p_diloco.peers.admission.drift import DriftCheck
from p2p_diloco.peers.gossip.measure import Sketcher
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.gossip.measure import measure
from p2p_diloco.peers.admission.protocol import Candidate, Island

MOMENTUM_CLIP = BoundsSettings().momentum_clip
VERSION_AHEAD, TOKEN_RATE = ClaimsSettings().version_ahead, ClaimsSettings().token_rate
DRIFT_ROUNDS, DECAY = DriftSettings().rounds, DriftSettings().decay

N = 2 * CHUNK + 12_345  # three slices, the last one short


def test_honest_claims_are_counted_as_they_are_and_a_false_one_is_clipped():
    # the members' records: one lies, the median does not follow it; a joining one does not count
    swarm = {f"p{i}": IslandRecord(peer_id=f"p{i}", endpoint="tcp://127.0.0.1:1", version=v, state="training")
             for i, v in enumerate([40, 41, 41, 1041])}
    swarm["new"] = IslandRecord(peer_id="new", endpoint="tcp://127.0.0.1:1", version=5000, state="joining")
    assert median_version(swarm) == 41 and median_version({}) is None
    claims, median = ClaimsCheck(), median_version(swarm)
    # before its first round it knows no tokens per round: the version alone is bounded
    assert claims.count(41, 2000, 10**9, median) == (42, 10**9, "version 2000 counted as 42")
    claims.own_round(1000)  # this island trains 1000 tokens a round
    assert claims.count(41, 42, 42_000, median) == (42, 42_000, None)  # an honest partner a version ahead
    assert claims.count(41, 30, 20_000, median) == (30, 20_000, None)  # an honest one behind
    v, t, what = claims.count(41, 41 + 1000, 41_000 * 1000, median)
    assert v == 41 + VERSION_AHEAD and t == int(TOKEN_RATE * v * 1000)
    assert what == f"version 1041 counted as {v}, tokens 41000000 counted as {t}" and claims.clipped == 2
    # an island resumed far behind the swarm counts the swarm's versions, as the members' median says
    assert claims.count(5, 41, 41_000, median)[0] == 41


def test_a_momentum_a_few_times_the_islands_own_is_mixed_at_the_learned_bound():
    bound = InfluenceBound(outer_momentum=0.9)
    assert bound.momentum_scale(100.0) == 1.0  # nothing learned yet: the order-of-magnitude bound alone
    for norm in (1.0, 1.1, 1.2, 1.3):
        bound.own_round(0.5, advance=0.1, momentum_norm=norm)
    own = max(1.15, 1.3)  # the median of the island's own momenta, or the last if larger
    assert bound.momentum_scale(1.3) == 1.0  # an honest partner's, as large as the island's own
    assert bound.momentum_scale(3 * 1.3) == pytest.approx(MOMENTUM_CLIP * own / (3 * 1.3))
    bound.adopted(momentum_norm=2.0)  # a joiner learns the scale of the momentum it took
    assert bound.momentum_scale(2.0 * MOMENTUM_CLIP) == pytest.approx(1.0)


def test_a_sketch_keeps_inner_products_across_slices():
    g = torch.Generator().manual_seed(0)
    x, noise = torch.randn(N, generator=g), torch.randn(N, generator=g)
    y = 0.6 * x + noise
    sketch = Sketcher(seed=1)
    sx, sy = Sketcher.empty(), Sketcher.empty()
    for i in range(0, N, CHUNK):
        sketch.add_(sx, x[i : i + CHUNK], i)
        sketch.add_(sy, y[i : i + CHUNK], i)
    assert float(sx @ sy) == pytest.approx(float(x.double() @ y.double()), rel=0.05)
    assert float(sx.norm()) == pytest.approx(float(x.norm()), rel=0.05)


def _partner(own: torch.Tensor, m: torch.Tensor, extra: torch.Tensor, g: torch.Generator, r: float):
    """A partner's state: the island's anchor, a fresh difference of norm `r` and `extra`."""
    noise = torch.randn(own.numel(), generator=g)
    return measure(own, own + noise * (r / noise.norm()) + extra, m, sketch=Sketcher(seed=2))


class _Drift:
    """The `drift` check with its ledger, judging moves as the admission has it judge them."""

    def __init__(self) -> None:
        self.check, self.ledger = DriftCheck(), PartnerLedger()

    def judge(self, peer: str, move: torch.Tensor, d: float) -> float:
        verdict = self.check.judge(Candidate(peer, None, None, SimpleNamespace(move=move)),
                                   Island(None, self.ledger, None, dict, d))
        assert verdict.refused is None  # (drift never refuses: a push that keeps one way is mixed ever more lightly)
        return verdict.cap

    def mixed(self, peer: str, weight: float) -> None:
        self.check.mixed(peer, weight, self.ledger)


def test_honest_differences_come_and_go_a_drift_is_capped_however_many_push_it():
    g = torch.Generator().manual_seed(0)
    own, m = torch.randn(N, generator=g), torch.randn(N, generator=g)
    direction = torch.randn(N, generator=g)
    direction /= direction.norm()
    r = d = float(own.norm()) * 1e-3  # a difference of one round of progress
    memory = _Drift()
    for _ in range(20):  # honest partners, and one a round ahead along the island's own progress
        for peer, extra in (("honest", 0.0), ("other", 0.0), ("ahead", m * (r / m.norm()))):
            cap = memory.judge(peer, _partner(own, m, extra, g, r).move, d)
            assert cap >= 0.99, (peer, cap)
            memory.mixed(peer, 0.5)
    caps = []
    for t in range(1, 20):  # two members pushing one direction, half a round farther every round, in turns
        peer = f"drift-{t % 2}"
        move = _partner(own, m, direction * (0.5 * t * r), g, r).move
        cap = memory.judge(peer, move, d)
        caps.append(cap)
        memory.mixed(peer, min(0.5, cap))
    assert caps[0] == 1.0 and caps[-1] < 0.1 and min(caps[:8]) < 0.5, caps
    # mixed ever more lightly, whoever pushes: at most what the decay frees at each mix, never refused
    assert min(0.5, caps[-1]) * float(move.norm()) == pytest.approx(DRIFT_ROUNDS * (1 - DECAY) * d, rel=0.1)
    assert DriftCheck.along(memory.check.sum, move) <= DRIFT_ROUNDS * d * 1.05


def test_attack_runs_are_judged_on_their_means_against_the_clean_mean():
    out = judged([[2.0, 2.2, 2.1], [2.2, 2.4, 2.3]], clean_mean=2.0)
    assert out["mean"] == pytest.approx(2.2) and out["ratio_to_clean_mean"] == pytest.approx(1.1)
    assert out["worst_ratio_to_clean_mean"] == pytest.approx((2.2 + 2.4) / 2 / 2.0)
    assert out["spread"] == pytest.approx((2 * 0.1**2) ** 0.5 / 2.0)
