"""The dashboard's model of the swarm: plain Python, no widgets, fed one `Snapshot` at a time.

A source delivers what discovery shows right now (`members()`); this module turns that series of
snapshots into what an operator wants to know: who is behind the freshest island and by how many
versions, how old each record is, per-island and swarm-wide history for the charts, swarm totals,
and an event log of joins, leaves, expiries and islands falling behind or catching up.

Discovery only says that a record is gone, not why. A record withdrawn while its island was still
announcing (a clean exit stores a tombstone) or whose last state was `leaving` counts as *left*;
one that vanished after at least half the record lifetime (`expiry`) of silence counts as
*expired*: the island stopped refreshing it without saying goodbye (a crash, a kill, a lost link).

Times are the snapshot's `t` (the source's clock), so a fixed series of snapshots always yields
the same state; record ages assume the islands' clocks are roughly in sync with ours (NTP).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from p2p_diloco.discovery.records import IslandRecord, island_label
from p2p_diloco.tui.source import Snapshot

HISTORY = 600
"""Samples kept per island and for the swarm (10 minutes at one snapshot a second)."""
EVENTS = 500
"""Event log entries kept."""


@dataclass(frozen=True)
class Sample:
    """One point of an island's history, taken when a snapshot showed it."""

    t: float
    version: int
    tokens: int
    tokens_per_s: float
    loss: float | None
    upload_bps: float
    download_bps: float


@dataclass(frozen=True)
class SwarmSample:
    """One point of the swarm's history."""

    t: float
    live: int
    tokens_per_s: float
    best_loss: float | None
    mean_loss: float | None


@dataclass(frozen=True)
class Event:
    seq: int
    t: float
    kind: str
    """join, state, leaving, left, expired, rejoin, behind, caught-up, connected, disconnected, log."""
    text: str
    peer_id: str | None = None


@dataclass
class IslandView:
    """Everything the dashboard knows about one island, live or recently gone."""

    record: IslandRecord
    first_seen: float
    last_change: float
    """Our time when the record last changed (a silent island keeps the same record)."""
    history: deque[Sample] = field(default_factory=lambda: deque(maxlen=HISTORY))
    behind: int = 0
    """Versions behind the freshest live island."""
    age: float = 0.0
    """Seconds since the island made its record."""
    gone: str | None = None
    """None while live; `left` or `expired` once the record is gone."""
    gone_at: float | None = None
    flagged_behind: bool = False

    @property
    def peer_id(self) -> str:
        return self.record.peer_id

    @property
    def label(self) -> str:
        """The island's name, or its peer id's prefix (`island_label`)."""
        return self.record.label

    @property
    def live(self) -> bool:
        return self.gone is None

    @property
    def shown_state(self) -> str:
        alone = self.record.alone and self.record.state in ("training", "syncing")
        return self.gone or ("alone" if alone else self.record.state)


@dataclass(frozen=True)
class SwarmTotals:
    live: int
    seen: int
    tokens_per_s: float
    best_loss: float | None
    mean_loss: float | None
    bytes_moved: int
    freshest_version: int
    run_seconds: float | None
    """Seconds since the earliest `started_at` of any island seen (None before the first record)."""


class SwarmState:
    """Ingests snapshots; holds islands, totals, histories and the event log (see the module docstring)."""

    def __init__(self, *, expiry: float = 30.0, behind_after: int = 8, stale_after: float = 15.0,
                 linger: float = 60.0) -> None:
        self.expiry = expiry
        """Record lifetime the islands use (tells an expiry from a clean leave)."""
        self.behind_after = behind_after
        """Versions behind the freshest at which an island counts as fallen behind (max staleness)."""
        self.stale_after = stale_after
        """Record age (seconds) shown as a warning; twice this is shown as bad."""
        self.linger = linger
        """Seconds a gone island stays listed before it is dropped."""
        self.islands: dict[str, IslandView] = {}
        self.events: deque[Event] = deque(maxlen=EVENTS)
        self.history: deque[SwarmSample] = deque(maxlen=HISTORY)
        self.now = 0.0
        self.status = "connecting"
        self.detail = ""
        self.kind: str | None = None
        self.snapshots = 0
        self._seq = 0
        self._run_started: float | None = None
        self._retired_bytes = 0

    # -- ingest ------------------------------------------------------------------------------

    def ingest(self, snap: Snapshot) -> list[Event]:
        """Take one snapshot; returns the events it caused (also appended to `events`)."""
        first = self._seq
        self.now = max(self.now, snap.t)
        self.snapshots += 1
        if snap.status != self.status or (snap.status == "disconnected" and snap.detail != self.detail):
            if snap.status in ("connected", "disconnected"):
                self.note(snap.status, f"via {snap.kind}: {snap.detail}" if snap.status == "connected" else snap.detail)
        self.status, self.detail = snap.status, snap.detail
        self.kind = snap.kind or self.kind
        if snap.records is not None:
            self._merge(snap.records)
            self._restale()
            self._drop_old()
            self.history.append(self._swarm_sample())
        return [e for e in self.events if e.seq > first]

    def note(self, kind: str, text: str, peer_id: str | None = None) -> Event:
        """Append an event at the current time (also used for log lines the app wants shown)."""
        self._seq += 1
        event = Event(self._seq, self.now, kind, text, peer_id)
        self.events.append(event)
        return event

    def _merge(self, records: dict[str, IslandRecord]) -> None:
        now, initial = self.now, not self.history  # islands already there when we first look "are in the swarm"
        for pid, rec in records.items():
            view = self.islands.get(pid)
            if rec.started_at > 0:
                self._run_started = rec.started_at if self._run_started is None else min(self._run_started, rec.started_at)
            if view is None:
                view = self.islands[pid] = IslandView(record=rec, first_seen=now, last_change=now)
                where = f"at {rec.endpoint.removeprefix('tcp://')} (v{rec.version}, {rec.state})"
                self.note("join", f"{view.label} {'in the swarm' if initial else 'joined'} {where}", pid)
            else:
                if view.gone is not None:
                    away = now - (view.gone_at or now)
                    self.note("rejoin", f"{view.label} is back after {away:.0f}s ({view.gone}), v{rec.version}", pid)
                    view.gone = view.gone_at = None
                if rec != view.record:
                    self._state_change(view, rec)
                    view.record, view.last_change = rec, now
            view.history.append(Sample(now, rec.version, rec.tokens, rec.tokens_per_s, rec.loss,
                                       rec.upload_bps, rec.download_bps))
        for pid, view in self.islands.items():
            if view.gone is None and pid not in records:
                silent = now - view.last_change
                leaving = view.record.state == "leaving"
                view.gone = "left" if leaving or silent < self.expiry / 2 else "expired"
                view.gone_at = now
                if view.gone == "left":
                    self.note("left", f"{view.label} left at v{view.record.version}", pid)
                else:
                    self.note("expired", f"{view.label} vanished without leaving (silent {silent:.0f}s, "
                                         f"record expired), last v{view.record.version}", pid)

    def _state_change(self, view: IslandView, rec: IslandRecord) -> None:
        if rec.refused > view.record.refused:
            n = rec.refused - view.record.refused
            self.note("refused", f"{view.label} refused {n} partner state{'s' * (n > 1)}, last from "
                                 f"{self.label_of(rec.last_refused)} (implausible, non-finite, or another model or run)",
                      rec.peer_id)
        if rec.alone != view.record.alone:
            if rec.alone:
                self.note("alone", f"{view.label} trains alone: {rec.alone}", rec.peer_id)
            else:
                self.note("alone", f"{view.label} mixes partners' states again", rec.peer_id)
        if rec.fetching and view.record.fetching and rec.fetching != view.record.fetching:
            self.note("fetches", f"{view.label} fetches {rec.fetches}", rec.peer_id)
        old, new = view.record.state, rec.state
        if old == new or {old, new} == {"training", "syncing"}:
            return  # training <-> syncing happens every round: not news
        if new == "leaving":
            self.note("leaving", f"{view.label} is leaving (v{rec.version})", rec.peer_id)
        else:
            self.note("state", f"{view.label} {old} -> {new} (v{rec.version})", rec.peer_id)

    def _restale(self) -> None:
        live = [v for v in self.islands.values() if v.live]
        freshest = max((v.record.version for v in live), default=0)
        for v in self.islands.values():
            v.age = max(0.0, self.now - v.record.timestamp) if v.record.timestamp else 0.0
            if not v.live:
                continue
            v.behind = freshest - v.record.version
            if v.record.state in ("joining", "leaving"):
                continue  # a joining island is behind until its first download lands: not news
            if v.behind > self.behind_after and not v.flagged_behind:
                v.flagged_behind = True
                self.note("behind", f"{v.label} fell {v.behind} versions behind (v{v.record.version} vs "
                                    f"v{freshest}; partners skip it beyond {self.behind_after})", v.peer_id)
            elif v.behind <= self.behind_after and v.flagged_behind:
                v.flagged_behind = False
                self.note("caught-up", f"{v.label} caught up ({v.behind} behind, v{v.record.version})", v.peer_id)

    def _drop_old(self) -> None:
        for pid in [p for p, v in self.islands.items() if v.gone_at is not None and self.now - v.gone_at > self.linger]:
            self._retired_bytes += self.islands.pop(pid).record.bytes_sent

    def _swarm_sample(self) -> SwarmSample:
        t = self.totals()
        return SwarmSample(self.now, t.live, t.tokens_per_s, t.best_loss, t.mean_loss)

    # -- queries -----------------------------------------------------------------------------

    def live(self) -> list[IslandView]:
        return [v for v in self.islands.values() if v.live]

    def totals(self) -> SwarmTotals:
        live = self.live()
        losses = [v.record.loss for v in live if v.record.loss is not None]
        return SwarmTotals(
            live=len(live), seen=len(self.islands),
            tokens_per_s=sum(v.record.tokens_per_s for v in live),
            best_loss=min(losses) if losses else None,
            mean_loss=sum(losses) / len(losses) if losses else None,
            bytes_moved=self._retired_bytes + sum(v.record.bytes_sent for v in self.islands.values()),
            freshest_version=max((v.record.version for v in live), default=0),
            run_seconds=None if self._run_started is None else max(0.0, self.now - self._run_started),
        )

    def behind_level(self, view: IslandView) -> int:
        """0 fine, 1 more than half the max staleness behind, 2 beyond it (partners skip it)."""
        return 2 if view.behind > self.behind_after else 1 if view.behind > self.behind_after / 2 else 0

    def age_level(self, view: IslandView) -> int:
        """0 fresh, 1 older than `stale_after`, 2 older than twice that."""
        return 2 if view.age > 2 * self.stale_after else 1 if view.age > self.stale_after else 0

    def label_of(self, peer_id: str | None) -> str:
        """How an island the dashboard may know by its record is shown (a partner, a refused one)."""
        view = self.islands.get(peer_id) if peer_id else None
        return island_label(view.record.name if view is not None else None, peer_id)

    def events_of(self, peer_id: str) -> list[Event]:
        return [e for e in self.events if e.peer_id == peer_id]

    def sorted_views(self, column: str = "id", reverse: bool = False) -> list[IslandView]:
        """Live islands ordered by `column` (see `SORT_KEYS`), then gone ones; unknown values always last."""
        key = SORT_KEYS[column]
        out: list[IslandView] = []
        for group in (self.live(), [v for v in self.islands.values() if not v.live]):
            known = [v for v in group if key(v) is not None]
            known.sort(key=lambda v: (key(v), v.peer_id), reverse=reverse)
            out += known + sorted((v for v in group if key(v) is None), key=lambda v: v.peer_id)
        return out


SORT_KEYS = {
    "id": lambda v: v.label,
    "address": lambda v: v.record.endpoint,
    "state": lambda v: v.shown_state,
    "version": lambda v: v.record.version,
    "behind": lambda v: v.behind if v.live else None,
    "age": lambda v: v.age,
    "tokens_per_s": lambda v: v.record.tokens_per_s,
    "utilization": lambda v: v.record.utilization or None,
    "loss": lambda v: v.record.loss,
    "upload": lambda v: v.record.upload_bps,
    "download": lambda v: v.record.download_bps,
    "partner": lambda v: v.record.last_partner,
}
"""Sort key of each peers-table column; None means unknown and sorts last either way."""
