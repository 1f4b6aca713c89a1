"""Pacing of outgoing messages: WAN link emulation on loopback, and the real upload cap.

Kernel netem is not always available, so the transport emulates a link itself. Every message a
process sends goes through one `Pacer`: it leaves once the link has serialized it at the link's
rate (a token bucket one message deep: each message occupies the link for `nbytes / rate`, back to
back) and arrives `latency_ms` later (one-way propagation delay). A server's `max_upload_mbps` is
the same bucket with a real purpose; when both are set the slower rate wins. With neither, the
pacer is inactive and the transport sends at once.

The pacer only computes due times and holds messages; the socket loop that owns it sends them.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any


def link_rate(bandwidth_mbps: float | None, max_upload_mbps: float | None) -> float | None:
    """Bytes per second of the slower of the emulated link and the upload cap (None: unlimited)."""
    rates = [r for r in (bandwidth_mbps, max_upload_mbps) if r is not None]
    return min(rates) * 1e6 / 8 if rates else None


class Pacer:
    """Holds outgoing messages until the emulated link would have delivered them, in FIFO order."""

    def __init__(self, latency_ms: float = 0.0, bytes_per_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert latency_ms >= 0 and (bytes_per_s is None or bytes_per_s > 0)
        self.latency_s = latency_ms / 1000.0
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._free_at = 0.0  # when the link finishes serializing what it already holds
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.bytes_per_s is not None

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, nbytes: int, item: Any) -> float:
        """Queue `item` (a message of `nbytes`) and return when it is due to be handed to the socket."""
        now = self._clock()
        leave = now
        if self.bytes_per_s is not None:
            self._free_at = max(now, self._free_at) + nbytes / self.bytes_per_s
            leave = self._free_at
        due = leave + self.latency_s
        heapq.heappush(self._heap, (due, next(self._seq), item))
        return due

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float | None = None) -> list[Any]:
        """Remove and return every held message whose time has come, oldest first."""
        now = self._clock() if now is None else now
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def clear(self) -> None:
        self._heap.clear()
