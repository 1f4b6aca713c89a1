"""The inner step's accelerator path, exercised on the host: the fused AdamW step that never reads the
loss, its skip of a non-finite step on the device, the compile setting and its fallback, and the
island's deferred reading of the losses (`StepLosses`)."""

from __future__ import annotations

import logging

import pytest
import torch

from p2p_diloco.config import ModelConfig, TrainConfig
from p2p_diloco.core.device import copy_async
from p2p_diloco.core.inner import InnerLoop, compiled, make_optimizer
from p2p_diloco.core.model import build_model
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.rounds.losses import READ_EVERY, StepLosses, loss_of


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], x[:, 1:]


def test_the_fused_step_returns_the_loss_unread_and_trains_as_the_foreach_step_does():
    foreach, fused = tiny(), tiny()
    a, b = InnerLoop(foreach, TrainConfig(warmup_steps=0)), InnerLoop(fused, TrainConfig(warmup_steps=0), fused=True)
    assert make_optimizer(tiny(), TrainConfig()).defaults["foreach"]  # off CUDA, by default
    for seed in range(3):
        la, lb = a.train_step(*batch(seed)), b.train_step(*batch(seed))
        assert isinstance(la, float) and isinstance(lb, torch.Tensor) and lb.dim() == 0 and not lb.requires_grad
        assert lb.item() == pytest.approx(la, rel=1e-5)
    for p, q in zip(foreach.parameters(), fused.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_a_non_finite_fused_step_is_skipped_on_the_device():
    model = tiny()
    inner = InnerLoop(model, TrainConfig(warmup_steps=0), fused=True)
    inner.train_step(*batch())
    state = {k: v.clone() for k, v in inner.optimizer.state[model.lm_head.weight].items()}
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")  # a NaN weight: the loss and every gradient follow
    before = [p.detach().clone() for p in model.parameters()]
    assert torch.isnan(inner.train_step(*batch(1)))
    for p, q in zip(before, model.parameters()):
        torch.testing.assert_close(p, q.detach(), equal_nan=True)  # not one weight moved
    after = inner.optimizer.state[model.lm_head.weight]
    assert all(torch.equal(state[k], after[k]) for k in state)  # nor the Adam state, nor its step count


def test_compile_follows_its_setting_and_a_failed_compilation_falls_back_to_eager(monkeypatch, caplog):
    model = tiny()
    assert compiled(model, "auto") is model and compiled(model, "off") is model  # auto: on CUDA only
    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(compile="yes")

    def broken(m):
        def forward(*args):
            raise RuntimeError("no C++ compiler here\nmore lines")
        return forward

    monkeypatch.setattr(torch, "compile", broken)
    inner = InnerLoop(model, TrainConfig(compile="on", warmup_steps=0))
    assert inner.forward is not model
    with caplog.at_level(logging.WARNING, logger="p2p_diloco.core.inner"):
        losses = [inner.train_step(*batch(k)) for k in range(3)]
    assert all(4.0 < v < 7.0 for v in losses) and inner.forward is model
    said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(said) == 1 and "no C++ compiler here" in said[0] and "more lines" not in said[0], said


def test_the_island_reads_kept_losses_together_in_order():
    losses = StepLosses()
    losses.add(loss_of(2.5))
    assert losses.due()  # a number is read as it comes
    assert losses.read() == [2.5] and losses.read() == []
    losses.add(loss_of(torch.tensor(1.0)))
    assert losses.due()  # so is a tensor on the host: reading it costs nothing
    for v in (torch.tensor(3.0), 4.0, torch.tensor([float("nan")])):
        losses.add(loss_of(v))
    values = losses.read()
    assert values[:3] == [1.0, 3.0, 4.0] and values[3] != values[3]  # NaN stays NaN, in its place
    with pytest.raises(TypeError, match="shape"):
        loss_of(torch.ones(2))
    assert READ_EVERY >= 8  # an accelerator's losses wait that many steps at most


def test_an_asynchronous_host_copy_off_cuda_is_done_when_it_returns():
    x, buf = torch.arange(6.0).reshape(2, 3), torch.empty(6)
    assert copy_async(x.reshape(-1), buf) is None and torch.equal(buf, torch.arange(6.0))
