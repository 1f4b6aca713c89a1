"""The inner loop: AdamW with linear warmup, cosine decay and global gradient-norm clipping.

The inner optimizer's state persists across rounds (as in DiLoCo): at each round start only the
weights are reset to the anchor, the Adam moments carry on.
"""

from __future__ import annotations

import math

import torch

from p2p_diloco.config import TrainConfig
from p2p_diloco.core.device import autocast


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Inner learning rate at inner step `step` (0-based): linear warmup, then cosine to the floor."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases or 1-d parameters)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=True)


class InnerLoop:
    """One island's local trainer: owns the optimizer and the inner step counter."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        self.model, self.cfg = model, cfg
        self.optimizer = make_optimizer(model, cfg)
        self.step = 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One AdamW step on batch (x, y) of shape (B, T); returns the training loss.

        A non-finite loss skips the step (no backward, no update: the weights stay as they were)
        and is returned as it is, for the island to count. A param group's `lr_scale` (set when an
        island rolls back after diverging) scales the schedule's rate.
        """
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.model.train()
        device = _device(self.model)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, self.cfg.precision):  # bf16: matmuls in bf16, weights and Adam state stay fp32
            _, loss = self.model(x, y)
        self.step += 1
        value = loss.item()
        if not math.isfinite(value):
            return value
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return value


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
