"""Where an island's wall time goes: inner steps, and each thing the training thread does besides.

`SwarmIsland.step()` books every second of the training thread since the first inner step into one
part: the time between two calls of `step()` is the user's inner step (`inner`); inside `step()`,
looking after the exchange between steps (`mix`: taking a partner's state that arrived, its checks,
mixing it; `probe`: the effect probe's two evaluations of the held-out batch, `peers.admission.probe`, a
check this island chose to run on its own device), the round's end (`end`: the guard's finiteness check, the mix of what
arrived last, the outer step, the snapshot the publishing thread publishes from), evaluation
(`eval`), checkpoints (`checkpoint`), and the rest (`other`: announces, the round's row and
progress line, bookkeeping). Before the first step the island spends `startup` (joining,
the first evaluation and publish, the wait for members); after its last round `final` (the final
mix and serving members behind it). What the publishing thread does (`peers.gossip.publishing`) overlaps
the inner steps and is reported apart (`background`), not booked.

So the parts add up to the wall time from the first step to the last round's end, and
`utilization` (inner over that) is what the simulator's model of an island (`p2p_diloco.sim`:
inner steps back to back, the exchange in the background, no probe, no evaluation) reads as 1
less the training thread's share of the round's ends; `net_utilization` leaves the probe out
(inner over the rest), the figure to hold against the simulator's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

PARTS = ("inner", "mix", "probe", "end", "eval", "checkpoint", "other")
"""The parts of the training thread's time from the first inner step to the last round's end."""


class TimeBook:
    """Seconds per part, for the current round and since the first step (see the module docstring)."""

    def __init__(self) -> None:
        self.round = dict.fromkeys(PARTS, 0.0)
        self.total = dict.fromkeys(PARTS, 0.0)
        self.startup_s = 0.0
        self.final_s = 0.0
        self._inside = 0.0

    frozen = False
    """After the last round's end: nothing more is booked (the final mix is `final_s`)."""

    def add(self, part: str, seconds: float) -> None:
        if not self.frozen:
            self.round[part] += seconds
            self.total[part] += seconds

    def timed(self, part: str, fn: Callable[[], T]) -> T:
        """`fn()`, its time booked as `part`."""
        with self.spend(part):
            return fn()

    @contextmanager
    def spend(self, part: str) -> Iterator[None]:
        """Book the time of the `with` block as `part` (nested blocks are booked once, to the innermost)."""
        t0, inside = time.perf_counter(), self._inside
        self._inside = 0.0
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self.add(part, spent - self._inside)
            self._inside = inside + spent

    def step_done(self, seconds: float) -> None:
        """A `step()` took `seconds`: what its booked parts do not cover goes to `other`."""
        self.add("other", max(0.0, seconds - self._inside))
        self._inside = 0.0

    def end_round(self) -> dict[str, float]:
        """The round's seconds by part (rounded for its row); the next round starts from zero."""
        out = {k: round(v, 4) for k, v in self.round.items()}
        self.round = dict.fromkeys(PARTS, 0.0)
        return out

    @property
    def training_s(self) -> float:
        """Seconds from the first step to now, as booked."""
        return sum(self.total.values())

    def utilization(self) -> float:
        """Share of the booked time spent in inner steps (0 before the first)."""
        return self.total["inner"] / self.training_s if self.training_s > 0 else 0.0

    def net_utilization(self) -> float:
        """`utilization` leaving the effect probe out."""
        rest = self.training_s - self.total["probe"]
        return self.total["inner"] / rest if rest > 0 else 0.0

    def split(self) -> str:
        """The booked shares as one line: `inner 0.952 mix 0.004 probe 0.030 end 0.002 eval 0.009 ...`."""
        whole = self.training_s
        return " ".join(f"{k} {v / whole:.3f}" for k, v in self.total.items()) if whole > 0 else ""

    def summary(self) -> dict[str, float]:
        """Every part's seconds, start-up and the final phase included (`spent` in the island's summary; each round's row has its round's)."""
        return {"startup": round(self.startup_s, 3), **{k: round(v, 3) for k, v in self.total.items()},
                "final": round(self.final_s, 3)}
