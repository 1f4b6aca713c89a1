"""The snapshots a server serves: the newest few, and older ones that a fetch is still reading.

A snapshot is immutable and served by sid. After a publish the newest `retain` stay; an older one
stays too while a fetch keeps reading it (a chunk of it was served within `hold_s`), at most
`extra` of those, the most recently read first. So a transfer that spans many rounds on a slow
link completes, instead of meeting `gone` the round after it began, and the memory a server holds
stays bounded by `retain + extra` snapshots. A reader silent for `hold_s` has failed already (its
fetch timed out), so its snapshot may go.
"""

from __future__ import annotations

import threading
import time

from p2p_diloco.exchange.payload import Published

EXTRA_HELD = 2
"""Older snapshots kept for fetches still reading them, beyond the newest `retain_snapshots`."""


class Shelf:
    """Snapshots by sid, oldest first; thread-safe (the training thread publishes, the socket
    thread reads)."""

    def __init__(self, retain: int, hold_s: float, extra: int = EXTRA_HELD) -> None:
        self.retain, self.hold_s, self.extra = retain, hold_s, extra
        self._lock = threading.Lock()
        self._snaps: dict[int, Published] = {}
        self._read_at: dict[int, float] = {}
        self.latest: Published | None = None

    def put(self, snap: Published, now: float | None = None) -> None:
        """Serve `snap` from now on; drop what no longer needs to be held (see the module docstring)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._snaps[snap.manifest.sid] = snap
            self.latest = snap
            self._forget(now)

    def drop_oldest(self, now: float | None = None) -> None:
        """Make room before packing a new snapshot: with `retain` served already, the oldest unread
        one goes first, so a publish never holds one snapshot more than it keeps afterwards."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._forget(now, keep_newest=self.retain - 1)

    def get(self, sid: int, now: float | None = None) -> Published | None:
        """The snapshot `sid`, if still served; marks it as being read."""
        now = time.monotonic() if now is None else now
        with self._lock:
            snap = self._snaps.get(sid)
            if snap is not None:
                self._read_at[sid] = now
            return snap

    def held(self) -> list[int]:
        """The sids served now, oldest first."""
        with self._lock:
            return list(self._snaps)

    def _forget(self, now: float, keep_newest: int | None = None) -> None:
        keep_newest = self.retain if keep_newest is None else keep_newest
        sids = list(self._snaps)
        older = sids[:max(0, len(sids) - keep_newest)]
        reading = sorted((s for s in older if now - self._read_at.get(s, -float("inf")) <= self.hold_s),
                         key=lambda s: self._read_at[s], reverse=True)[:self.extra]
        for sid in older:
            if sid not in reading:
                self._snaps.pop(sid)
                self._read_at.pop(sid, None)
