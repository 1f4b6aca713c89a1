"""The outer loop's arithmetic against hand-computed values."""

import pytest
import torch

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.core.outer import (
    OuterState, PartnerState, mix, mixing_weight, nesterov_step, outer_update
)


def state(phi, m=None, version=0, tokens=0):
    phi = torch.tensor(phi, dtype=torch.float32)
    s = OuterState.fresh(phi)
    if m is not None:
        s.m = torch.tensor(m, dtype=torch.float32)
    s.version, s.tokens = version, tokens
    return s


def partner(phi, m=None, delta=None, version=0, tokens=0):
    t = lambda v: None if v is None else torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return PartnerState(phi=t(phi), m=t(m), delta=t(delta), version=version, tokens=tokens)


def test_nesterov_step_matches_hand_computation():
    s = state([1.0, 2.0], m=[0.5, -1.0])
    nesterov_step(s, torch.tensor([0.1, 0.2]), lr=0.7, mu=0.9)
    # m' = 0.9 m + delta = [0.55, -0.70]; phi' = phi - 0.7 (delta + 0.9 m') = [0.5835, 2.301]
    assert torch.allclose(s.m, torch.tensor([0.55, -0.70]), atol=1e-6)
    assert torch.allclose(s.phi, torch.tensor([0.5835, 2.301]), atol=1e-6)


def test_two_nesterov_steps_accumulate_momentum():
    s = state([0.0])
    for _ in range(2):
        nesterov_step(s, torch.tensor([1.0]), lr=0.5, mu=0.5)
    # step 1: m=1, phi=-0.5*(1+0.5)=-0.75; step 2: m=1.5, phi=-0.75-0.5*(1+0.75)=-1.625
    assert s.m.item() == pytest.approx(1.5)
    assert s.phi.item() == pytest.approx(-1.625)


def test_token_weights():
    cfg = DiLoCoConfig(mix_weight=0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=100)) == pytest.approx(0.5)
    assert mixing_weight(cfg, 5, 100, partner([0.0], version=5, tokens=300)) == pytest.approx(0.75)
    assert mixing_weight(cfg, 5, 300, partner([0.0], version=5, tokens=100)) == pytest.approx(0.25)
    # a fresh joiner (no tokens) meeting a trained partner adopts it; a trained island ignores a fresh one
    assert mixing_weight(cfg, 0, 0, partner([0.0], version=5, tokens=1000)) == pytest.approx(1.0)
    assert mixing_weight(cfg, 5, 1000, partner([0.0], version=0, tokens=0)) == pytest.approx(0.0)
    unweighted = DiLoCoConfig(mix_weight=0.3, token_weighting=False)
    assert mixing_weight(unweighted, 5, 100, partner([0.0], version=5, tokens=900)) == pytest.approx(0.3)


def test_staleness_decay_and_cutoff():
    cfg = DiLoCoConfig(mix_weight=0.5, max_staleness=8, staleness_decay=0.5, token_weighting=False)
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=10)) == pytest.approx(0.5)
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=6)) == pytest.approx(0.5 * (1 - 0.5 * 4 / 8))
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=2)) == pytest.approx(0.5 * 0.5)  # lag 8: at the cutoff
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=1)) == 0.0  # lag 9: beyond it, skipped
    assert mixing_weight(cfg, 10, 0, partner([0.0], version=15)) == pytest.approx(0.5)  # ahead: no penalty


def test_two_islands_mixing_with_equal_weights_end_identical():
    cfg = DiLoCoConfig(momentum="mixed", mix_weight=0.5)
    a, b = state([1.0, 2.0], m=[0.1, 0.0], version=3, tokens=50), state([3.0, -2.0], m=[0.3, 0.4], version=3, tokens=50)
    pa = partner(a.phi.tolist(), a.m.tolist(), version=a.version, tokens=a.tokens)
    pb = partner(b.phi.tolist(), b.m.tolist(), version=b.version, tokens=b.tokens)
    mix(a, pb, mixing_weight(cfg, a.version, a.tokens, pb), cfg)
    mix(b, pa, mixing_weight(cfg, b.version, b.tokens, pa), cfg)
    assert torch.equal(a.phi, b.phi) and torch.equal(a.m, b.m)
    assert torch.allclose(a.phi, torch.tensor([2.0, 0.0]))


def test_local_momentum_is_not_mixed():
    cfg = DiLoCoConfig(momentum="local")
    a = state([0.0], m=[1.0])
    mix(a, partner([2.0], m=[5.0]), 0.5, cfg)
    assert a.phi.item() == pytest.approx(1.0) and a.m.item() == pytest.approx(1.0)


def test_outer_update_mixes_before_the_own_step():
    """The partner's state is contemporaneous with our anchor before this round's step."""
    cfg = DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0, mix_pseudo_gradient=False, token_weighting=False)
    s = state([0.0], version=4, tokens=10)
    outer_update(s, torch.tensor([1.0]), [(partner([2.0], version=4, tokens=10), 0.5)], cfg)
    # mixed anchor 1.0, then our step of -1.0: the step is kept whole, not halved by the mix
    assert s.phi.item() == pytest.approx(0.0)
    assert s.version == 5


def test_outer_update_averages_pseudo_gradients_when_asked():
    cfg = DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0, mix_pseudo_gradient=True)
    s = state([0.0])
    outer_update(s, torch.tensor([1.0]), [(partner([0.0], delta=[3.0]), 0.5)], cfg)
    assert s.phi.item() == pytest.approx(-2.0)
    assert s.delta.item() == pytest.approx(1.0)  # what we publish is our own delta


def test_mixing_on_arrival_keeps_the_islands_own_pseudo_gradient():
    """Anchor and running weights move by the same shift, so `phi - theta` is still our own progress."""
    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.core.data import BatchSampler
    from p2p_diloco.core.island import Island
    from p2p_diloco.core.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    isl = Island("a", model, TrainConfig(batch_size=2, warmup_steps=0), DiLoCoConfig(token_weighting=False),
                 BatchSampler(data, 8, 2, seed=0))
    for _ in range(3):
        isl.inner_step()
    own, anchor = isl.pseudo_gradient(), isl.state.phi.clone()
    other = PartnerState(phi=anchor + 1.0, m=None, delta=None, version=isl.state.version, tokens=0)
    theta = isl.params_vector()
    a = isl.mix_arrived(other)
    assert a == pytest.approx(0.5) and torch.allclose(isl.params_vector() - theta, torch.full_like(anchor, 0.5))
    assert torch.allclose(isl.state.phi, anchor + 0.5)
    assert torch.allclose(isl.pseudo_gradient(), own, atol=1e-6)
    isl.end_round([])  # our own step from the mixed anchor; the next round starts with no arrivals
    assert isl.state.version == 1 and isl.arrived == []
