"""What an island with `--exchange auto` fetches, from the link it measured: written once, for the
island (`peers.rounds`) and the simulator (`sim.auto`).

Whole states (weights and momentum) while moving one takes a small share of a round; compressed
updates of the public state (`core.public`) once it would not: on such links updates that fit a
round did better than whole states that land late (BENCHMARKS.md, "Slow links"). An island starts
with whole states and measures the link on the first one: a whole-state fetch whose rest would take
too long at the rate seen gives way to updates at once (`give_way`), so a slow link costs a short
probe, not rounds. Two thresholds apart (hysteresis) keep a link near one of them from flipping the
choice each round.

Both choices pay a fetch's round trips, so what decides is the transfer: a whole state's bytes at
the rate measured from partners, against a round. A fetch's rate is measured between its chunks'
arrivals (`exchange.client.FetchStats.data_bytes_per_s`), so that neither a long round trip nor the
wait for a partner's next version passes for a slow link.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

UPDATES_ABOVE = 0.15
"""A whole state whose transfer would take more than this share of a round: fetch updates."""
STATE_BELOW = 0.075
"""Back to whole states only once one's transfer would take less than this share of a round."""
PROBE_SHARE = 0.05
"""A running whole-state fetch is judged once its data has flowed for this share of a round."""


@dataclass(frozen=True)
class Fit:
    """One choice of what to fetch, and why."""

    updates: bool
    """Fetch public-state updates (else the whole state)."""
    ratio: float | None
    """A whole state's transfer time over a round's time, as measured (None: no rate measured yet)."""
    reason: str
    """What was measured, for the log, the record, `status` and the dashboard."""

    @property
    def name(self) -> str:
        return "updates" if self.updates else "state"

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


class LinkFit:
    """One island's choice, from the rates it measured of its partners (see the module docstring)."""

    def __init__(self) -> None:
        self.fit: Fit | None = None
        self._rates: dict[object, float] = {}

    def measured(self, peer: object, rate_bps: float) -> None:
        """A fetch from `peer` showed this rate (bytes per second, measured between its chunks)."""
        if rate_bps > 0:
            self._rates[peer] = rate_bps

    def rate(self) -> float | None:
        """The median rate measured from partners, bytes per second (None: none yet)."""
        return statistics.median(self._rates.values()) if self._rates else None

    def choose(self, state_bytes: int, round_s: float) -> tuple[Fit, bool]:
        """What to fetch next, and whether that changed: `state_bytes` is what a whole state moves,
        `round_s` how long a round takes."""
        rate = self.rate()
        if rate is None or round_s <= 0 or state_bytes <= 0:
            fit = Fit(False, None, "no link measured yet (a whole state that does not fit gives way to updates)")
        else:
            ratio, was_updates = state_bytes / rate / round_s, self.fit is not None and self.fit.updates
            updates = ratio > (STATE_BELOW if was_updates else UPDATES_ABOVE)
            fit = Fit(updates, ratio, f"a whole state ({state_bytes / 1e6:.2f} MB) takes {ratio:.3f} rounds to move at "
                                      f"{rate * 8 / 1e6:.2f} Mbit/s (updates above {UPDATES_ABOVE:g}, whole states "
                                      f"below {STATE_BELOW:g})")
        changed = self.fit is None or fit.updates != self.fit.updates
        self.fit = fit
        return fit, changed

    @staticmethod
    def give_way(data_s: float, rate_bps: float, received: int, state_bytes: int, round_s: float) -> bool:
        """Whether a running whole-state fetch should give way to updates: one whose data has flowed
        for `data_s` seconds at `rate_bps` (NaN: not measured yet) and brought `received` bytes,
        judged after `PROBE_SHARE` of a round, once the rest would take more than `UPDATES_ABOVE` of one."""
        if round_s <= 0 or not rate_bps > 0 or data_s < PROBE_SHARE * round_s:
            return False
        return (state_bytes - received) / rate_bps > UPDATES_ABOVE * round_s
