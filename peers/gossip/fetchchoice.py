"""What each of an island's fetches asks for: with `--exchange auto`, the whole state or public-state
updates, whichever fits the link the island measures (`core.linkfit`); with a fixed exchange, the
same every time (updates whenever the island holds public states). And in how many fragments the
island's own updates go (`parts`).

An island's first fetch with `--exchange auto` (its *first contact*) asks for updates from the
run's initial weights, which every island that started the run holds (a fragment or two; only in
the first `FIRST_CONTACT_WITHIN` versions of a run the island started: a joiner's or a resumed
island's first fetch probes with a whole state), not for the whole state: on a
slow link a whole state's probe holds the partner's uplink for a chunk or more after it gives way
(at 0.07 Mbit/s a 64 KiB chunk is 7 s, two rounds of the tiny preset), where the update lands
within the round and, if its data flowed long enough (`LinkFit.contact_measures`), measures the
link as a probe does. One too small to measure it (a fast link) measures nothing, and
the next fetch probes with a whole state as before. Said nowhere: it is not a choice of what to
fetch.

`FetchChoice` is the part of the island's rounds (`peers.rounds.schedule`) that owns that choice: it is asked
before each fetch, told what each fetch started and what each one measured, judges a running
whole-state fetch (`give_way`), and says each change once, in the log and in the island's record.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from p2p_diloco.core.linkfit import LinkFit
from p2p_diloco.core.modes import Exchange
from p2p_diloco.discovery.records import IslandRecord

log = logging.getLogger(__name__)

REPROBE_EVERY = 8
"""On updates, every this many fetches one asks for the whole state again (a probe, said nowhere)
unless one of them measured the link as a probe does (its data flowed for `PROBE_SHARE` of a round):
on a link still too slow it gives way within a twentieth of a round; otherwise it lands, measures
the link, and the island goes back to whole states (said once). On a fast link an update fetch is
too small to measure it, so without the probe one rate measured while a partner was starved of CPU
would keep an island on updates there; on a slow one an update measures the link, and a probe would
cost the round its mix. The simulator's links are
what it models, so it does not probe."""


class FetchChoice:
    """See the module docstring."""

    def __init__(self, exchange: Exchange, name: str, peer_id: str,
                 at_start: Callable[[], bool] = lambda: True) -> None:
        """`at_start`: whether the island may make its first contact now (`PublicSide.at_start`)."""
        self.name, self.exchange, self.peer_id, self._at_start = name, exchange, peer_id, at_start
        self.fit = LinkFit() if exchange.adaptive else None
        self._parts = 1
        self._running: tuple[str, bool] | None = None
        """The partner of the fetch started last, and whether it asked for updates."""
        self._on_updates = 0
        """Fetches of updates since the last whole state asked for (`REPROBE_EVERY`)."""
        self._measured = False
        """One of those measured the link."""
        self._round_s = 0.0
        self._first = True
        """The next fetch is the island's first contact (the module docstring)."""
        self._contact: str | None = None
        """The partner of the first-contact fetch, until it lands."""
        self._landed: tuple[str, float, int] | None = None
        """The first contact's partner, rate and bytes, until a round's length is known to judge them."""
        self.measured_last: tuple[str | None, float] = (None, 0.0)
        """The partner whose link a fetch measured last, and the rate (bytes per second): the
        island's record says it, and that partner reads it as its uplink's (`parts`)."""

    def next(self, state_bytes: int, round_s: float) -> tuple[bool, bool | None]:
        """Whether the next fetch asks for updates, and the partner choice's ring for it (None: the
        chooser's own). With `--exchange auto` a change is said once."""
        if self.fit is None:
            return True, None
        self._round_s = round_s
        if self._landed is not None and round_s > 0:  # the first contact landed: judged now a round's length is known
            (peer_id, rate, nbytes), self._landed = self._landed, None
            if LinkFit.contact_measures(nbytes, rate, round_s):
                self._measured_from(peer_id, rate)
        if self._contacting() or (self._landed and not self.fit.probed):
            return True, True
        before = self.fit.fit
        fit, changed = self.fit.choose(state_bytes, round_s)
        if changed:
            level = logging.INFO if before is None and not fit.updates else logging.WARNING  # (a slow link: said)
            what = "public-state updates" if fit.updates else "whole states"
            log.log(level, "%s fetches %s now: %s", self.name, what, fit.reason)
        self._on_updates = self._on_updates + 1 if fit.updates else 0
        if self._on_updates > REPROBE_EVERY:
            self._on_updates, measured, self._measured = 0, self._measured, False
            if not measured:  # a whole state from the ring partner: it measures that link
                return False, True
        return fit.updates, fit.updates

    def waits(self, updates: bool) -> bool:
        """Whether a fetch asking for updates (or not) may wait for its partner to publish this
        island's version (`IslandConfig.same_version_wait`). Not one of `--exchange auto` on updates,
        which it chose because the link is slow: there an update takes a good share of a round, and
        a wait would land it in the next one, staler than the version it waited for. Nor its first
        whole state, before any rate was measured: on a slow link it is a probe that gives way, and
        the updates that follow it in the same round have no time for a wait."""
        return not (self.fit is not None and (updates or not self.fit.probed))

    def started(self, peer_id: str, updates: bool) -> None:
        self._running = (peer_id, updates)
        contact = updates and self._contacting()
        self._first, self._contact = self._first and not contact, peer_id if contact else None

    def _contacting(self) -> bool:
        """The next fetch is the island's first contact: nothing fetched or probed yet, at a run's start."""
        return self._first and self.fit is not None and not self.fit.probed and self._at_start()

    @property
    def judging(self) -> bool:
        """A whole-state fetch of `--exchange auto` was started and not judged yet (`give_way`)."""
        return self.fit is not None and self._running is not None and not self._running[1]

    def give_way(self, progress: tuple[float, int, float, float] | None, state_bytes: int, round_s: float) -> bool:
        """Whether the running fetch (`GossipWorker.progress()`) is a whole state that will not fit the
        link and should be given up for updates (`LinkFit.give_way`); the rate it showed is measured.
        A fetch is judged so once."""
        if not self.judging or progress is None:
            return False
        _, received, data_s, rate = progress
        if not self.fit.give_way(data_s, rate, received, state_bytes, round_s):
            return False
        self._measured_from(self._running[0], rate)
        self._running = (self._running[0], True)
        return True

    def landed(self, peer_id: str, rate_bps: float, nbytes: int) -> None:
        """A fetch from `peer_id` finished, at this rate (bytes per second), bringing `nbytes`."""
        if self.fit is None:
            return
        if self._contact == peer_id:  # the first contact measures the link only as a probe would
            self._contact, self._landed = None, (peer_id, rate_bps, nbytes)
            return
        self._measured_from(peer_id, rate_bps)
        if rate_bps > 0 and self._running == (peer_id, True) and LinkFit.flowed(nbytes / rate_bps, self._round_s):
            self._measured = True  # an update that took as long as a probe: it measured the link

    def _measured_from(self, peer_id: str, rate_bps: float) -> None:
        self.fit.measured(peer_id, rate_bps)
        if rate_bps > 0:
            self.measured_last = (peer_id, rate_bps)

    def slowest_rate(self) -> float:
        """The slowest partner rate measured lately, bytes per second (0: none, or a fixed exchange)."""
        return (self.fit.rate() or 0.0) if self.fit is not None else 0.0

    def parts(self, update_bytes: int, members: Mapping[str, IslandRecord]) -> int:
        """The fragments this island's next update goes in (`core.public`): the exchange's own, or with
        `--exchange auto` as many as its uplink calls for, as the `members` whose last fetch was
        from this island measured it (`LinkFit.parts`); a change is said once (the updates before
        any rate is heard are not a choice to say)."""
        if self.fit is None:
            return self.exchange.fragments
        for reader, record in members.items():
            if record.fetched_from == self.peer_id and reader != self.peer_id:
                self.fit.heard(reader, record.fetched_bps)
        parts, why = self.fit.parts(update_bytes, self._round_s, self.exchange.fragments)
        if why and parts != self._parts:  # (before a rate is measured, small updates go out unsaid)
            log.warning("%s sends its updates in %s now: %s", self.name, _fragments(parts), why)
            self._parts = parts
        return parts

    def describe(self) -> str:
        """What the island fetches now and why, for its record ("" with a fixed exchange)."""
        if self.fit is None or self.fit.fit is None:
            return ""
        return str(self.fit.fit) + (f"; sends updates in {_fragments(self._parts)}" if self._parts > 1 else "")


def _fragments(parts: int) -> str:
    return "whole" if parts == 1 else f"{parts} fragments"
