"""An island's own divergence: a non-finite loss or non-finite weights roll it back to its anchor.

Without this, a diverged island crashed when it published (a non-finite state cannot travel) and
wrote the non-finite state as its latest checkpoint on the way out, which `--resume` then refused.
Now `SwarmIsland.step()` reports every loss here:

- a non-finite loss is counted (the project's own inner loop skips such a step; a user's loop has
  already taken it, so the weights are checked too);
- at `BAD_STEPS` in a row, or at once when the weights themselves are no longer finite, the
  island rolls back: the weights return to the anchor (the state of the last outer step, which is
  finite: nothing non-finite is ever mixed), the inner optimizer's state (moments) is cleared, and
  its learning rate is multiplied by `LR_CUT`, with one warning saying so;
- a divergence within the round after a partner's state was mixed (`suspect`) is blamed on that
  partner, not on the learning rate: the rollback keeps the learning rate and the partner's state
  is counted as refused (`on_blame`), so a member whose states diverge others is set aside as one
  refused by the checks is (`peers.gossip.partners`); the mix itself was bounded (`core.influence`);
- the learning rate is never cut below `LR_FLOOR` of its start: a warning says once that it is
  there, and later rollbacks keep it.

The round goes on from there; checkpoints never hold non-finite values (`checkpoint.save` refuses).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import torch

from p2p_diloco.core.codecs import all_finite
from p2p_diloco.core.island import OuterLoop

log = logging.getLogger(__name__)
BAD_STEPS = 3
"""Non-finite losses in a row that roll the island back."""
LR_CUT = 0.5
"""Each rollback multiplies the inner learning rate by this."""
LR_FLOOR = 1 / 64
"""Rollbacks cut the learning rate to at most this fraction of its start (six cuts)."""


class DivergenceGuard:
    """Watches one island's losses and weights; rolls it back when it diverges (see the module docstring).

    It owns nothing but its counts: it acts on the island's outer loop (weights and anchor), its
    inner optimizer and, when there is one, the scheduler (anything with `base_lrs`)."""

    def __init__(self, name: str, outer: OuterLoop, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                 on_blame: Callable[[str, str], None] = lambda peer, why: None) -> None:
        """`on_blame(peer, why)`: a divergence was blamed on that partner's mixed state."""
        self.name, self.outer, self.optimizer, self.scheduler = name, outer, optimizer, scheduler
        self.on_blame = on_blame
        self.bad_in_a_row = 0
        self.rollbacks = 0
        self.lr_scale = 1.0
        """What the rollbacks cut the learning rate to, of its start."""

    def after_step(self, loss: float | None, suspect: str | None = None) -> bool:
        """Account for one inner step's loss; True when the island was rolled back. `suspect`: the
        partner whose state was mixed since the outer step before last, if any."""
        if loss is None or math.isfinite(float(loss)):
            self.bad_in_a_row = 0
            return False
        self.bad_in_a_row += 1
        if self.bad_in_a_row >= BAD_STEPS or not self.weights_finite():
            self.roll_back(f"{self.bad_in_a_row} non-finite losses in a row", suspect)
            return True
        return False

    def weights_finite(self) -> bool:
        return all(all_finite(view) for _, _, view in self.outer.slices)

    @torch.no_grad()
    def roll_back(self, why: str, suspect: str | None = None) -> None:
        """Weights back to the anchor, inner optimizer state cleared, learning rate cut (kept when a
        `suspect` partner is blamed, or at `LR_FLOOR`)."""
        self.outer.slices.load(self.outer.state.phi)
        self.optimizer.state.clear()
        self.bad_in_a_row = 0
        self.rollbacks += 1
        if suspect is not None:
            log.warning("%s diverged (%s) in the round after mixing the state of %s: back to its anchor at "
                        "version %d, inner optimizer state cleared, learning rate kept; that state counts as "
                        "refused (rollback %d)", self.name, why, suspect[:8], self.outer.state.version, self.rollbacks)
            self.on_blame(suspect, f"{self.name} diverged in the round after mixing it")
            return
        cut = LR_CUT if self.lr_scale * LR_CUT >= LR_FLOOR * (1 - 1e-9) else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] *= cut
            group["lr_scale"] = group.get("lr_scale", 1.0) * cut
            if "initial_lr" in group:
                group["initial_lr"] *= cut
        if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
            self.scheduler.base_lrs = [lr * cut for lr in self.scheduler.base_lrs]
        self.lr_scale *= cut
        log.warning("%s diverged (%s): back to its anchor at version %d, inner optimizer state cleared, "
                    "learning rate x%g of its start%s (rollback %d)", self.name, why, self.outer.state.version,
                    self.lr_scale, "" if cut < 1 else ", its floor: rollbacks no longer cut it", self.rollbacks)
