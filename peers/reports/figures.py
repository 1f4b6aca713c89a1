"""What a user's loop hands the island and what it reads back: the loss `step()` takes
(`loss_of`, read when needed: `StepLosses`) and the figures `figures()` returns (`Figures`, every field and its sign).

Kept apart from `peers.island`, whose facade only calls these: the island does the work, this
module says what the numbers at its edge are.
"""

from __future__ import annotations

import numbers
from typing import TypedDict

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


class Figures(TypedDict):
    """`SwarmIsland.figures()`: the island's figures now, what the dashboard shows of it. Counts are
    since this process started the island (a resumed island's `round` and `tokens` come back with
    its checkpoint)."""

    peer_id: str
    """The island's discovery peer id."""
    name: str
    """Its label (`IslandConfig.name`, else the peer id's first 8 characters)."""
    version: int
    """Outer steps of its state: its own, plus those it took over from partners ahead of it."""
    round: int
    """Rounds this island finished."""
    tokens: int
    """Tokens this island (all its ranks) trained on in finished rounds."""
    partner: str | None
    """Peer id of the last partner whose fetched state was mixed in (None before the first mix)."""
    staleness: int | None
    """At that mix, this island's version minus the partner's: positive, the partner's state was that
    many outer steps behind (it weighs less, nothing from `max_staleness + 1`); 0, in step; negative,
    the partner was ahead (it weighs in full; -1 is common: the partner had already taken this
    round's outer step). None before the first mix."""
    mixes: int
    """Partner states mixed with a weight above 0 (fetched or pushed)."""
    refused: int
    """Partner states refused by the checks before mixing (wrong model or run, implausible, too far)."""
    failed_fetches: int
    """Fetches that failed on the way (timeouts, lost connections; not refusals)."""
    too_stale: int
    """Partner states that arrived more than `max_staleness` versions behind (weighed 0)."""
    alone: str | None
    """Why the island trains alone (no partner mixed for a while), None while it does not."""
    fetches: str
    """What `--exchange auto` fetches now and why ("" with a fixed exchange)."""
    bytes_in: int
    """Bytes received: fetches, joins, catch-ups."""
    bytes_out: int
    """Bytes sent: states served to partners, plus states pushed."""
    loss: float | None
    """The loss last passed to `step()` (None before one, or while it is not finite)."""
    eval_loss: float | None
    """The last `eval_fn()` result (None without `eval_fn`)."""
    state: str
    """`joining`, `syncing` (downloading the swarm's state), `training` or `leaving`."""
    reach: str
    """`direct` (others can dial it) or `outbound` (it fetches and pushes, nobody dials it)."""
