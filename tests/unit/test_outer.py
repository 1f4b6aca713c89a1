"""The outer loop's arithmetic against hand-computed values."""

import pytest
import torch

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.core.modes import momentum_mode
from p2p_diloco.core.outer import OuterState, PartnerState, mix, mix_counters_, mixing_weight, nesterov_, staleness_discount


def state(phi, m=None, version=0, tokens=0):
    phi = torch.tensor(phi, dtype=torch.float32)
    s = OuterState.fresh(phi)
    if m is not None:
        s.m = torch.tensor(m, dtype=torch.float32)
    s.version, s.tokens = version, tokens
    return s


def partner(phi, m=None, version=0, tokens=0):
    t = lambda v: None if v is None else torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return PartnerState(phi=t(phi), m=t(m), version=version, tokens=tokens)


def test_nesterov_step_matches_hand_computation():
    s = state([1.0, 2.0], m=[0.5, -1.0])
    nesterov_(s.phi, s.m, torch.tensor([0.1, 0.2]), lr=0.7, mu=0.9)
    # m' = 0.9 m + delta = [0.55, -0.70]; phi' = phi - 0.7 (delta + 0.9 m') = [0.5835, 2.301]
    assert torch.allclose(s.m, torch.tensor([0.55, -0.70]), atol=1e-6)
    assert torch.allclose(s.phi, torch.tensor([0.5835, 2.301]), atol=1e-6)


def test_two_nesterov_steps_accumulate_momentum():
    s = state([0.0])
    for _ in range(2):
        nesterov_(s.phi, s.m, torch.tensor([1.0]), lr=0.5, mu=0.5)
    # step 1: m=1, phi=-0.5*(1+0.5)=-0.75; step 2: m=1.5, phi=-0.75-0.5*(1+0.75)=-1.625
    assert s.m.item() == pytest.approx(1.5)
    assert s.phi.item() == pytest.approx(-1.625)


def test_token_weights():
    cfg = DiLoCoConfig(mix_weight=0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=100)) == pytest.approx(0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=300)) == pytest.approx(0.75)
    assert mixing_weight(cfg, 5, 300, partner([0.0], version=5, tokens=100)) == pytest.approx(0.25)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=200)) == pytest.approx(2 / 3)
    # a trained island ignores a fresh one; a fresh one mixes at the base weight (joiners adopt instead)
    assert mixing_weight(cfg, 5, 1000, partner([0.0], version=0, tokens=0)) == pytest.approx(0.0)
    assert mixing_weight(cfg, 0, 0, partner([0.0], version=5, tokens=1000)) == pytest.approx(0.5)
    unweighted = DiLoCoConfig(mix_weight=0.3, token_weighting=False)
    assert mixing_weight(unweighted, 5, 100, partner([0.0], version=5, tokens=900)) == pytest.approx(0.3)


@pytest.mark.parametrize("claim", [301, 10**6, 10**30, 2**63 - 1])
def test_no_token_claim_lifts_a_partner_past_the_bound(claim):
    """`max_token_ratio` 3 caps the weight at 2 x 0.5 x 3/4 = 0.75: the island keeps a quarter of its own state."""
    cfg = DiLoCoConfig(mix_weight=0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=claim)) == pytest.approx(0.75)
    strong = DiLoCoConfig(mix_weight=1.0, max_token_ratio=100.0)
    assert 0.0 <= mixing_weight(strong, 5, 100, partner([0.0], version=5, tokens=claim)) <= 1.0


@pytest.mark.parametrize("claim", [0, -1, -100, -(10**30)])
def test_zero_or_negative_token_claims_only_mute_the_claimer(claim):
    cfg = DiLoCoConfig(mix_weight=0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=claim)) == 0.0
    s = state([0.0], version=5, tokens=100)
    mix_counters_(s, partner([0.0], version=5, tokens=claim), 0.5, cfg)
    assert s.tokens == 50  # counted as 0, never negative


def test_mixed_tokens_and_version_are_bounded_whatever_is_claimed():
    cfg = DiLoCoConfig(mix_weight=0.5, max_version_jump=1)
    s = state([0.0], version=7, tokens=100)
    hostile = partner([0.0], version=10**12, tokens=10**30)
    a = mixing_weight(cfg, s.version, s.tokens, hostile)
    mix_counters_(s, hostile, a, cfg)
    assert s.version == 8 and s.tokens == round(0.25 * 100 + 0.75 * 300)
    # so an honest partner still at version 7 is one behind, not 10**12: nearly full weight
    assert mixing_weight(cfg, s.version, s.tokens, partner([0.0], version=7, tokens=s.tokens)) > 0.45
    # an honest partner one ahead is followed; one behind leaves the version alone
    for v, expected in ((9, 9), (3, 9)):
        mix_counters_(s, partner([0.0], version=v, tokens=s.tokens), 0.5, cfg)
        assert s.version == expected
    wider = DiLoCoConfig(max_version_jump=4)
    mix_counters_(s, hostile, 0.5, wider)
    assert s.version == 13


def test_staleness_discount_falls_smoothly_to_zero_past_the_bound():
    cfg = DiLoCoConfig(mix_weight=0.5, max_staleness=8, staleness_decay=0.5, token_weighting=False)
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=10)) == pytest.approx(0.5)
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=15)) == pytest.approx(0.5)  # ahead: no penalty
    # x = lag / 9: 1 - x/2 - x^2/2
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=9)) == pytest.approx(0.5 * (1 - 1 / 18 - 1 / 162))
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=2)) == pytest.approx(0.5 * (1 - 4 / 9 - 32 / 81))
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=1)) == 0.0  # lag 9 = max_staleness + 1
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=-(10**12))) == 0.0
    factors = [staleness_discount(cfg, lag) for lag in range(0, 12)]
    assert all(b <= a for a, b in zip(factors, factors[1:]))
    assert max(a - b for a, b in zip(factors, factors[1:])) < 0.17  # no cliff: at most 1/6 per version
    assert factors[9:] == [0.0, 0.0, 0.0]
    linear = DiLoCoConfig(max_staleness=3, staleness_decay=1.0)
    assert [staleness_discount(linear, lag) for lag in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    assert mixing_weight(DiLoCoConfig(max_staleness=0), 5, 0, partner([0.0], version=4)) == 0.0


def test_two_islands_mixing_with_equal_weights_end_identical():
    cfg = DiLoCoConfig(mix_weight=0.5)
    a, b = state([1.0, 2.0], m=[0.1, 0.0], version=3, tokens=50), state([3.0, -2.0], m=[0.3, 0.4], version=3, tokens=50)
    pa = partner(a.phi.tolist(), a.m.tolist(), version=a.version, tokens=a.tokens)
    pb = partner(b.phi.tolist(), b.m.tolist(), version=b.version, tokens=b.tokens)
    mix(a, pb, mixing_weight(cfg, a.version, a.tokens, pb), cfg, momentum_mode(cfg.momentum))
    mix(b, pa, mixing_weight(cfg, b.version, b.tokens, pa), cfg, momentum_mode(cfg.momentum))
    assert torch.equal(a.phi, b.phi) and torch.equal(a.m, b.m)
    assert torch.allclose(a.phi, torch.tensor([2.0, 0.0]))


def test_local_momentum_is_not_mixed():
    cfg = DiLoCoConfig(momentum="local")
    a = state([0.0], m=[1.0])
    mix(a, partner([2.0], m=[5.0]), 0.5, cfg, momentum_mode("local"))
    assert a.phi.item() == pytest.approx(1.0) and a.m.item() == pytest.approx(1.0)


def island(cfg):
    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.core.data import BatchSampler
    from p2p_diloco.core.island import Island
    from p2p_diloco.core.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    return Island("a", model, TrainConfig(batch_size=2, warmup_steps=0), cfg, BatchSampler(data, 8, 2, seed=0))


def test_the_round_end_mixes_before_the_own_step():
    """A partner's state that arrives after the last inner step is contemporaneous with our anchor
    before this round's step: it is mixed into that anchor, and our own step is kept whole."""
    cfg = DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0, token_weighting=False, momentum="local")
    isl = island(cfg)
    for _ in range(2):
        isl.inner_step()
    own, anchor = isl.pseudo_gradient(), isl.state.phi.clone()
    (a,) = isl.end_round([PartnerState(phi=anchor + 2.0, m=None, version=0, tokens=0)])
    assert a == pytest.approx(0.5) and isl.state.version == 1
    assert torch.allclose(isl.state.phi, anchor + 1.0 - own, atol=1e-6)
    assert torch.allclose(isl.params_vector(), isl.state.phi)  # the next round starts from the new anchor


def test_a_given_pseudo_gradient_replaces_the_own():
    """Synchronous all-reduce passes the mean pseudo-gradient; the step is taken slice by slice."""
    cfg = DiLoCoConfig(outer_lr=0.5, outer_momentum=0.5)
    isl = island(cfg)
    anchor, mean = isl.state.phi.clone(), torch.linspace(-1, 1, isl.state.phi.numel())
    isl.inner_step()
    isl.end_round([], delta=mean)
    m = mean.clone()
    assert torch.equal(isl.state.m, m) and torch.allclose(isl.state.phi, anchor - 0.5 * (mean + 0.5 * m))


def test_mixing_on_arrival_keeps_the_islands_own_pseudo_gradient():
    """Anchor and running weights move by the same shift, so `phi - theta` is still our own progress."""
    isl = island(DiLoCoConfig(token_weighting=False))
    for _ in range(3):
        isl.inner_step()
    own, anchor = isl.pseudo_gradient(), isl.state.phi.clone()
    other = PartnerState(phi=anchor + 1.0, m=None, version=isl.state.version, tokens=0)
    theta = isl.params_vector()
    a = isl.mix_arrived(other)
    assert a == pytest.approx(0.5) and torch.allclose(isl.params_vector() - theta, torch.full_like(anchor, 0.5))
    assert torch.allclose(isl.state.phi, anchor + 0.5)
    assert torch.allclose(isl.pseudo_gradient(), own, atol=1e-6)
    isl.end_round([])  # our own step from the mixed anchor
    assert isl.state.version == 1


@pytest.mark.parametrize("mode", ["rescaled-int4", "rescaled-sign"])
def test_travelling_momentum_is_blended_and_rescaled(mode):
    def mixed(own_m, their_m):
        s = state([0.0, 0.0], m=list(own_m), version=3, tokens=10)
        mix(s, partner([2.0, 0.0], m=list(their_m), version=3, tokens=10), 0.5, DiLoCoConfig(momentum=mode),
            momentum_mode(mode))
        return s.m.tolist()

    # opposite directions would shrink the blend; the rescale keeps the interpolated norm
    assert mixed((1.0, 0.0), (0.0, 1.0)) == pytest.approx([2**-0.5, 2**-0.5])
    assert mixed((2.0, 0.0), (-2.0, 0.0)) == [0.0, 0.0]  # nothing to rescale
    assert momentum_mode(mode).travels and momentum_mode(mode).codec == mode.removeprefix("rescaled-")


def test_local_momentum_travels_not_and_a_removed_mode_is_a_config_error():
    from p2p_diloco.errors import ConfigError

    assert not momentum_mode("local").travels
    with pytest.raises(ConfigError, match="momentum must be one of rescaled-int4, rescaled-sign, local"):
        momentum_mode("noloco")
    with pytest.raises(ConfigError, match="diloco.momentum"):
        DiLoCoConfig(momentum="mixed")
