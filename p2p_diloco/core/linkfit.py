"""What an island with `--exchange auto` fetches, from the link it measured: written once, for the
island (`peers.rounds.schedule`) and the simulator (`sim.auto`).

Whole states (weights and momentum) while moving one takes a small share of a round; compressed
updates of the public state (`core.public`) once it would not: on such links updates that fit a
round did better than whole states that land late (BENCHMARKS.md, "Slow links"). An island starts
with whole states and measures the link on the first one: a whole-state fetch whose rest would take
too long at the rate seen gives way to updates at once (`give_way`), so a slow link costs a short
probe, not rounds. Two thresholds apart (hysteresis) keep a link near one of them from flipping the
choice each round.

Where even an update takes half a round, the island sends its updates in fragments
(`core.public`): the fewest (a power of two) of which one moves in `FRAGMENT_SHARE` of a round at
that rate (`parts`); below that, whole updates mixed whole did better than fragments mixed a
share at a time. The sender chooses, from what its partners measured of its own uplink (`heard`:
each island's record says the rate of its last fetch and whom it fetched from), not from what it
measured of theirs: two fast islands that fetched from a slow one once would otherwise send each
other fragments they do not need, and mix a share at a time. Each update says its span, so a
receiver follows any choice.

Both choices pay a fetch's round trips, so what decides is the transfer: a whole state's bytes at
the slowest rate measured from a partner lately, against a round. The slowest, not the median: in a
swarm where some members sit behind a slow uplink, an island that fetches whole states from the
fast ones gives one up whenever it meets a slow one, where updates from its ring partner fit every
round (BENCHMARKS.md, "A heterogeneous swarm"). Lately: a rate counts for `RATE_MEMORY` choices,
so that one measured while a partner was starved of CPU, or of a member that left, does not hold
an island on updates for good. A fetch's rate is measured between its chunks' arrivals
(`exchange.client.FetchStats.data_bytes_per_s`), so that neither a long round trip nor the wait for
a partner's next version passes for a slow link.
"""

from __future__ import annotations

from dataclasses import dataclass

UPDATES_ABOVE = 0.15
"""A whole state whose transfer would take more than this share of a round: fetch updates."""
STATE_BELOW = 0.075
"""Back to whole states only once one's transfer would take less than this share of a round."""
PROBE_SHARE = 0.05
"""A running whole-state fetch is judged once its data has flowed for this share of a round."""
RATE_MEMORY = 16
"""A partner's rate counts for this many fetch choices after it was measured."""
FIRST_CONTACT_WITHIN = 8
"""An island's first fetch takes updates (its first contact, `peers.gossip.fetchchoice`) only within this many
versions of a run it started at the initial weights: later, or for a joiner, a partner's public state
is a long chain or lags its anchor far, and the island probes with a whole state."""
FIRST_CONTACT_MIN_S = 0.1
"""... and measures a link only where its data flowed for at least this long (as well as for
`PROBE_SHARE` of a round): a few kB take milliseconds on loopback, where a loaded machine's
scheduling alone makes a short round's twentieth look like a slow link."""
FRAGMENTS_ABOVE = 0.5
"""An update that would take more than this share of a round goes in fragments (BENCHMARKS.md, "Fragments")."""
FRAGMENT_SHARE = 0.15
"""... in as many as put one under this share of a round."""
FEWER_BELOW = 0.7
"""Fewer fragments only once the fewer would take under this share of their bound (hysteresis)."""


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
        self._rates: dict[object, tuple[float, int]] = {}
        """Per partner: the rate measured last (bytes per second) and the choice it was measured at."""
        self._choices = 0
        self._heard: dict[object, tuple[float, int]] = {}
        """Per partner: the rate it measured last fetching from this island, and the choice it was heard at."""
        self._parts: int | None = None
        """The fragments chosen last from a measured rate (None: not from one)."""

    def measured(self, peer: object, rate_bps: float) -> None:
        """A fetch from `peer` showed this rate (bytes per second, measured between its chunks)."""
        if rate_bps > 0:
            self._rates[peer] = (rate_bps, self._choices)

    def heard(self, reader: object, rate_bps: float) -> None:
        """`reader`'s last fetch was from this island and showed this rate (its record says so)."""
        if rate_bps > 0:
            self._heard[reader] = (rate_bps, self._choices)

    @property
    def probed(self) -> bool:
        """Some fetch measured a partner's rate (however long ago)."""
        return bool(self._rates)

    def rate(self) -> float | None:
        """The slowest rate measured from a partner in the last `RATE_MEMORY` choices, bytes per
        second (None: none)."""
        return self._slowest(self._rates)

    def uplink_rate(self) -> float | None:
        """The slowest rate a partner measured fetching from this island in the last `RATE_MEMORY`
        choices, bytes per second (None: none heard)."""
        return self._slowest(self._heard)

    def _slowest(self, rates: dict[object, tuple[float, int]]) -> float | None:
        recent = [rate for rate, at in rates.values() if self._choices - at < RATE_MEMORY]
        return min(recent) if recent else None

    def choose(self, state_bytes: int, round_s: float) -> tuple[Fit, bool]:
        """What to fetch next, and whether that changed: `state_bytes` is what a whole state moves,
        `round_s` how long a round takes."""
        rate, self._choices = self.rate(), self._choices + 1
        if rate is None or round_s <= 0 or state_bytes <= 0:
            fit = Fit(False, None, f"no link measured {'lately' if self._rates else 'yet'} (a whole state that does "
                                   f"not fit gives way to updates)")
        else:
            ratio, was_updates = state_bytes / rate / round_s, self.fit is not None and self.fit.updates
            updates = ratio > (STATE_BELOW if was_updates else UPDATES_ABOVE)
            fit = Fit(updates, ratio, f"a whole state ({state_bytes / 1e6:.2f} MB) takes {ratio:.3f} rounds to move at "
                                      f"{rate * 8 / 1e6:.2f} Mbit/s, the slowest partner's (updates above "
                                      f"{UPDATES_ABOVE:g}, whole states below {STATE_BELOW:g})")
        changed = self.fit is None or fit.updates != self.fit.updates
        self.fit = fit
        return fit, changed

    def parts(self, update_bytes: int, round_s: float, most: int) -> tuple[int, str]:
        """How many fragments the next update goes in (at most `most`), and why ("": no rate to say):
        none (1) while a whole update moves in `FRAGMENTS_ABOVE` of a round at the slowest rate
        heard lately (`uplink_rate`), else the fewest, a power of two, of which one moves in
        `FRAGMENT_SHARE`; fewer than chosen last only with a margin (`FEWER_BELOW`). With no rate
        heard lately, the last choice stays; before any, `most`: an island's first updates go out
        before a partner measures its link, and one that is too big for it would hold its
        receivers' fetches for rounds (on a fast link nobody fetches them)."""
        rate, was = self.uplink_rate(), self._parts
        if rate is None or round_s <= 0 or update_bytes <= 0:
            return min(was or most, most), ""
        ratio, want = update_bytes / rate / round_s, 1
        if ratio > FRAGMENTS_ABOVE * (FEWER_BELOW if (was or 1) > 1 else 1):
            want = 2
            while want < most and ratio / want > FRAGMENT_SHARE:
                want *= 2
            if was is not None and 1 < want < min(was, most) and ratio / want > FRAGMENT_SHARE * FEWER_BELOW:
                want = min(was, most)
        self._parts = want = min(want, most)
        return want, (f"an update ({update_bytes / 1e3:.0f} kB) takes {ratio:.2f} rounds to move at "
                      f"{rate * 8 / 1e6:.2f} Mbit/s, as its partners measured its uplink (fragments "
                      f"above {FRAGMENTS_ABOVE:g}, each under {FRAGMENT_SHARE:g})")

    @staticmethod
    def flowed(data_s: float, round_s: float, at_least: float = 0.0) -> bool:
        """Whether a fetch whose data flowed for `data_s` seconds measured the link as a probe does: for
        `PROBE_SHARE` of a round of `round_s`, and for `at_least` seconds."""
        return data_s >= max(PROBE_SHARE * round_s, at_least)

    @staticmethod
    def contact_measures(nbytes: int, rate_bps: float, round_s: float) -> bool:
        """Whether a first contact of `nbytes` that showed `rate_bps` measured the link: its data flowed
        for `PROBE_SHARE` of a round and for `FIRST_CONTACT_MIN_S` (`peers.gossip.fetchchoice`)."""
        return rate_bps > 0 and round_s > 0 and LinkFit.flowed(nbytes / rate_bps, round_s, FIRST_CONTACT_MIN_S)

    @staticmethod
    def give_way(data_s: float, rate_bps: float, received: int, state_bytes: int, round_s: float) -> bool:
        """Whether a running whole-state fetch should give way to updates: one whose data has flowed
        for `data_s` seconds at `rate_bps` (NaN: not measured yet) and brought `received` bytes,
        judged after `PROBE_SHARE` of a round, once the rest would take more than `UPDATES_ABOVE` of one."""
        if round_s <= 0 or not rate_bps > 0 or not LinkFit.flowed(data_s, round_s):
            return False
        return (state_bytes - received) / rate_bps > UPDATES_ABOVE * round_s
