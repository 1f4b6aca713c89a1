"""The loss a user's loop hands `step()`: what it may be (`loss_of`), and its reading, deferred on an
accelerator so that the loop never waits on the device for a number nobody reads yet (`StepLosses`).
"""

from __future__ import annotations

import numbers

import torch

LOSS_KINDS = "a float, a one-element tensor, or an object with a `.loss` tensor (a Hugging Face ModelOutput)"


READ_EVERY = 32
"""Losses on an accelerator kept unread at most this many steps (`StepLosses`)."""


def loss_of(loss: object) -> torch.Tensor | float:
    """The loss passed to `SwarmIsland.step(loss=...)`, not read yet: `loss` itself (a number, or a
    one-element tensor, detached) or its `.loss` (a Hugging Face `ModelOutput`). Anything else is a
    `TypeError` naming what was given."""
    if not isinstance(loss, (torch.Tensor, numbers.Real)) and hasattr(loss, "loss"):
        if loss.loss is None:
            raise TypeError(f"step(loss=...) got a {type(loss).__name__} whose .loss is None (the model computes "
                            "a loss only when given labels); pass the loss itself")
        loss = loss.loss
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise TypeError(f"step(loss=...) takes {LOSS_KINDS}; got a tensor of shape {tuple(loss.shape)}")
        return loss.detach()
    if isinstance(loss, numbers.Real):
        return float(loss)
    raise TypeError(f"step(loss=...) takes {LOSS_KINDS}; got {type(loss).__name__}")


class StepLosses:
    """The losses of the steps since they were last read, in order. A number, or a tensor on the
    host, is read as it comes; a tensor on an accelerator is kept unread (reading it waits for the
    device: a host synchronisation per step, which keeps the host from queuing the next step's work
    ahead), and the island reads them together (`read`) when it needs them: at a round's end, at a
    mid-round announce, and every `READ_EVERY` steps (the divergence guard sees them that late)."""

    def __init__(self) -> None:
        self._kept: list[torch.Tensor | float] = []

    def add(self, loss: torch.Tensor | float) -> None:
        self._kept.append(loss)

    def due(self) -> bool:
        """Whether to read now: the last one is on the host, or `READ_EVERY` wait."""
        last = self._kept[-1] if self._kept else None
        return not isinstance(last, torch.Tensor) or last.device.type == "cpu" or len(self._kept) >= READ_EVERY

    def read(self) -> list[float]:
        """Every kept loss as a float, in order, and none kept (tensors on one device: one sync)."""
        kept, self._kept = self._kept, []
        tensors = [x for x in kept if isinstance(x, torch.Tensor)]
        if len({x.device for x in tensors}) == 1 and len(tensors) > 1:
            values = iter(torch.stack([x.float().reshape(()) for x in tensors]).tolist())
            return [next(values) if isinstance(x, torch.Tensor) else x for x in kept]
        return [float(x) for x in kept]
