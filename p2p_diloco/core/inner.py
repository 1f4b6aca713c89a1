"""The inner loop: AdamW with linear warmup, cosine decay and global gradient-norm clipping.

The inner optimizer's state persists across rounds (as in DiLoCo): at each round start only the
weights are reset to the anchor, the Adam moments carry on.

On an accelerator a step never waits for the device: AdamW is fused (one kernel for all
parameters), a step with a non-finite loss or gradient norm is skipped on the device (the fused
optimizer's `found_inf`, as a gradient scaler uses it), and the loss comes back as a tensor that
nobody reads until it is logged (`peers.rounds.losses.StepLosses`). On the host the loss is read at
once (it costs nothing there) and a non-finite one skips the backward pass too. `[train] compile`
runs the training forward through `torch.compile` (by default on CUDA); a compilation that fails
falls back to eager, said once.
"""

from __future__ import annotations

import logging
import math

import torch

from p2p_diloco.config import TrainConfig
from p2p_diloco.core.device import autocast

log = logging.getLogger(__name__)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Inner learning rate at inner step `step` (0-based): linear warmup, then cosine to the floor."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases or 1-d parameters); `fused`
    (default: on CUDA) is one kernel for every parameter, else `foreach`."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = _device(model).type == "cuda" if fused is None else fused
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **({"fused": True} if fused else
                                                                                 {"foreach": True}))


def compiled(model: torch.nn.Module, setting: str) -> torch.nn.Module:
    """What the training forward calls: `torch.compile(model)` where `setting` (`[train] compile`)
    asks for it (`auto`: on CUDA), else the model itself."""
    if setting == "on" or (setting == "auto" and _device(model).type == "cuda"):
        return torch.compile(model)
    return model


class InnerLoop:
    """One island's local trainer: owns the optimizer and the inner step counter."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, fused: bool | None = None) -> None:
        self.model, self.cfg = model, cfg
        self.optimizer = make_optimizer(model, cfg, fused)
        self.step = 0
        self.forward = compiled(model, cfg.compile)
        """What the training forward calls (the model, or its `torch.compile`)."""
        self._tried = self.forward is model
        """Whether a compiled forward ran once (a failure after that is not the compiler's)."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | float:
        """One AdamW step on batch (x, y) of shape (B, T); returns the training loss: a float when
        the optimizer is not fused, else a detached tensor that was not read (see the module docstring).

        A non-finite loss (or, fused, gradient norm) skips the step (the weights and Adam state stay
        as they were) and is returned as it is, for the island to count. A param group's `lr_scale`
        (set when an island rolls back after diverging) scales the schedule's rate.
        """
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.model.train()
        device = _device(self.model)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, self.cfg.precision):  # bf16: matmuls in bf16, weights and Adam state stay fp32
            loss = self._loss(x, y)
        self.step += 1
        fused = bool(self.optimizer.defaults.get("fused"))
        if not fused:
            value = loss.item()
            if not math.isfinite(value):
                return value
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = None
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if fused:  # skipped on the device when not finite: no host synchronisation
            bad = ~torch.isfinite(loss.detach()) if norm is None else ~(torch.isfinite(loss.detach()) & torch.isfinite(norm))
            self.optimizer.found_inf = bad.float()
        self.optimizer.step()
        return loss.detach() if fused else value

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The forward's loss; the first compiled forward that fails is said once, and eager takes over."""
        if self._tried:
            return self.forward(x, y)[1]
        try:
            loss = self.forward(x, y)[1]
        except Exception as e:  # (the compiler's errors are of many kinds; eager shows a real one again)
            log.warning("torch.compile of the model failed (%s: %s); training without it from now on "
                        "([train] compile = \"off\" skips the attempt)", type(e).__name__, str(e).splitlines()[0][:300])
            self.forward = self.model
            loss = self.model(x, y)[1]
        self._tried = True
        return loss


def _device(model: torch.nn.Module) -> torch.device:
    """Where the model lives: batches follow it there (the data loader stays on the host)."""
    return next(model.parameters()).device


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
             precision: str = "fp32") -> float:
    """Mean cross-entropy (nats per byte) of `model` over fixed validation batches."""
    was_training = model.training
    model.eval()
    device = _device(model)
    with autocast(device, precision):
        total = sum(model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))[1].item()
                    for x, y in batches) / len(batches)
    model.train(was_training)
    return total
