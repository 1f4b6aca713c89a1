"""`p2p-diloco join`'s own training loop: the project's GPT on the project's data, through the public API.

The CLI is a user of `SwarmIsland` like any other: `Trainer` is its inner loop (AdamW with warmup
and cosine decay, on batches drawn from the island's own stream of the data), and `train` is the
loop a user would write: an inner step, then `island.step()`, until `island.done`. The trainer's
position (sampler and schedule) is the island's `extra_state`, so `--resume` continues the data
stream and the schedule where they were.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from p2p_diloco.config import TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.core.inner import InnerLoop


class Trainer:
    """The project's inner loop on one island (the sampler is set once the island's identity is known).

    On CUDA the next batch is drawn while a step runs, pinned and already on its way to the device
    (an asynchronous copy), so a step never waits for its batch; its position is what a checkpoint
    keeps (`state_dict`): a resumed island trains on that batch again rather than skip it."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        self.inner = InnerLoop(model, cfg)
        self.sampler: BatchSampler | None = None
        self.device = next(model.parameters()).device
        self._next: tuple[torch.Tensor, torch.Tensor] | None = None
        self._position: torch.Tensor | None = None
        """The sampler's state before `_next` was drawn."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.inner.optimizer

    @property
    def tokens_per_step(self) -> int:
        return self.sampler.batch_size * self.sampler.block_size

    def step(self) -> torch.Tensor | float:
        x, y = self._next or self._draw()
        if self.device.type == "cuda":  # the next batch travels while this step computes
            self._position = self.sampler.state()
            self._next = self._draw()
        return self.inner.train_step(x, y)

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.sampler.next()
        if self.device.type != "cuda":
            return x, y
        return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)

    def size_schedule(self, total_steps: int) -> None:
        self.inner.cfg = dataclasses.replace(self.inner.cfg, total_steps=max(1, total_steps))

    def state_dict(self) -> dict[str, Any]:
        position = self.sampler.state() if self._next is None else self._position
        return {"sampler": position, "inner_step": self.inner.step,
                "total_steps": self.inner.cfg.total_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.set_state(state["sampler"])
        self._next = None
        self.inner.step = int(state["inner_step"])
        self.size_schedule(int(state["total_steps"]))


def train(island: Any, trainer: Trainer, max_seconds: float | None = None, size_by_time: bool = False) -> None:
    """Inner steps and `island.step()` until the island is done.

    With `size_by_time` (a budget in seconds only), the cosine schedule is sized from the speed of
    the first round.
    """
    sized = not size_by_time or island.round > 0  # resumed: the schedule came back with the checkpoint
    while not island.done:
        loss = trainer.step()
        island.step(loss=loss, tokens=trainer.tokens_per_step)
        if not sized and island.round >= 1:
            per_s = trainer.inner.step / max(island.inner_seconds, 1e-6)
            trainer.size_schedule(island.share(int(per_s * max_seconds)))
            sized = True
