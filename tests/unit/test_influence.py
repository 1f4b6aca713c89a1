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
from p2p_diloco.admission import AdmissionConfig, BoundsSettings
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
APART_AFTER, APART_MOST, CLIP, MOMENTUM_CLIP, START_ROUNDS = (BOUNDS.apart_after, BOUNDS.apart_most, BOUNDS.clip,
                                                              BOUNDS.momentum_clip, BOUNDS.start_rounds)

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


def _judge(island: Island, phi: torch.Tensor, m: torch.Tensor | None = None, version: int | None = None,
           honest: float = 0.0):
    """Why `island` refuses this state (None: it does not), what it measured, and the weight it
    would mix it with; its gate has learned the distance `honest` (0: it has learned nothing)."""
    admission = admission_of(island)
    for _ in range(4 if honest else 0):
        admission.check("gate").accepted.append(honest)
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


def test_each_poison_is_refused_or_its_influence_bounded(trained):
    a, b, initial, before = trained
    phi, m = b.state.phi, b.state.m
    honest = measure(a.state.phi, phi).distance
    refused = {
        "momentum x1e4": _judge(a, phi, m * 1e4, honest=honest)[0],
        "anchor x1.5": _judge(a, phi * 1.5, m)[0],  # by the start bound, before the gate learned
        "initial weights": _judge(a, initial, m, honest=honest)[0],
        "last change reversed": _judge(a, 2 * before - phi, m, honest=honest)[0],
    }
    assert "implausible momentum" in refused["momentum x1e4"]
    assert "implausible" in refused["anchor x1.5"]
    assert "behind" in refused["initial weights"]
    assert "behind" in refused["last change reversed"]
    # noise at 4x the median distance accepted: let through by the gate, moved by at most CLIP rounds
    noise = torch.randn(phi.numel(), generator=torch.Generator().manual_seed(0))
    noisy = phi + noise * (4 * honest * a.state.phi.norm() / noise.norm())
    why, measured, weight = _judge(a, noisy, m, honest=honest)
    assert why is None and weight * measured.gap == pytest.approx(min(0.5 * measured.gap, CLIP * a.progress()), rel=1e-6)


def test_a_stale_partner_is_judged_at_its_lag():
    """A state as far back along the island's progress as its version is behind is an honest, stale one."""
    bound = InfluenceBound(outer_momentum=0.5)
    for _ in range(3):
        bound.own_round(1.0, advance=0.4)
    assert bound.behind(along=0.4 * 3, lag=2) is None
    assert "behind" in bound.behind(along=0.4 * 4, lag=2)
    assert bound.behind(along=None, lag=0) is None and InfluenceBound(0.5).behind(along=10.0, lag=0) is None


def test_a_state_versions_apart_may_differ_in_size_by_as_many_rounds():
    """An island resumed 5 versions behind the swarm is about 5 rounds of progress from its states."""
    bound = InfluenceBound(outer_momentum=0.5)
    assert bound.size(norm=15.0, own_norm=10.0, d=1.0, lag=-5) is None
    assert bound.size(norm=5.0, own_norm=10.0, d=1.0, lag=5) is None
    assert "bound 2)" in bound.size(norm=15.0, own_norm=10.0, d=1.0, lag=0)
    assert bound.size(norm=15.0, own_norm=10.0, d=None, lag=0) is None


def test_an_island_that_mixed_nothing_for_long_widens_its_bounds_and_mixes_narrow_them_again():
    """Two honest islands that trained apart drift apart: the bounds widen by sqrt(2 n) rounds for the n
    rounds past `APART_AFTER` without a mix (at most `APART_MOST`), say so, and narrow as mixes come."""
    bound = InfluenceBound(outer_momentum=0.5)
    for _ in range(APART_AFTER):
        bound.own_round(1.0, advance=0.4)
    assert bound.apart_rounds() == 0 and bound.start_bound(1.0, 100.0) == pytest.approx(START_ROUNDS / 100)
    assert "bound 2)" in bound.size(norm=16.0, own_norm=10.0, d=1.0, lag=0)
    assert "behind" in bound.behind(along=0.4 * 4, lag=0)
    for _ in range(18):
        bound.own_round(1.0, advance=0.4)
    assert bound.apart_rounds() == pytest.approx(6.0)  # sqrt(2 x 18)
    assert bound.size(norm=16.0, own_norm=10.0, d=1.0, lag=0) is None
    assert bound.behind(along=0.4 * 4, lag=0) is None
    assert "6.0 of it for 26 rounds unmixed" in bound.size(norm=19.0, own_norm=10.0, d=1.0, lag=0)
    assert bound.start_bound(1.0, 100.0) == pytest.approx((START_ROUNDS + 6) / 100)
    assert bound.apart_distance(1.0, 100.0) == pytest.approx(0.06) and bound.apart_distance(None, 100.0) == 0
    bound.mixed()
    assert bound.unmixed == 13 and bound.apart_rounds() == pytest.approx(10 ** 0.5)
    bound.mixed()
    assert bound.apart_rounds() == 0
    for _ in range(1000):
        bound.own_round(1.0, advance=0.4)
    assert bound.apart_rounds() == APART_MOST
    bound.mixed(adopted=True)
    assert bound.unmixed == 0


def test_a_mix_halves_the_rounds_unmixed_and_an_adopted_state_ends_them(trained):
    a, b, _, _ = trained
    a.influence.unmixed = 40
    assert a.weight(PartnerState(b.state.phi, b.state.m, a.state.version, a.state.tokens), count=False) > 0
    assert a.influence.unmixed == 40  # (the probe's look at a weight mixes nothing)
    assert a.weight(PartnerState(b.state.phi, b.state.m, a.state.version, a.state.tokens)) > 0
    assert a.influence.unmixed == 20
    joiner = _island("j", 5)
    joiner.influence.unmixed = 40
    joiner.adopt(PartnerState(a.state.phi.clone(), a.state.m.clone(), a.state.version, a.state.tokens))
    assert joiner.influence.unmixed == 0


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
    for _ in range(4):
        admission.check("gate").accepted.append(honest)
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
