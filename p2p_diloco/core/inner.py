"""The inner loop: AdamW with linear warmup, cosine decay and global gradient-norm clipping.

The inner optimizer's state persists across rounds (as in DiLoCo): at each round start only the
weights are reset to the anchor, the Adam moments carry on.
"""

from __future__ import annotations

import math

import torch

from p2p_diloco.config import TrainConfig


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
        """One AdamW step on batch (x, y) of shape (B, T); returns the training loss."""
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        _, loss = self.model(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.step += 1
        return loss.item()


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy (nats per byte) of `model` over fixed validation batches."""
    was_training = model.training
    model.eval()
    total = sum(model(x, y)[1].item() for x, y in batches) / len(batches)
    model.train(was_training)
    return total
