"""Pacing of outgoing messages: the real upload cap, and WAN link emulation on loopback.

Every message a process sends goes through one `Pacer`, a model of its uplink in two stages:

1. the queue: messages wait for the link, one FIFO per flow (per peer), served round robin so one
   big download cannot starve a peer that only wants a manifest;
2. the wire: the link serializes one message at a time at `bytes_per_s` (a token bucket one
   message deep), and the message arrives `latency_ms` after its last byte left (one-way delay).

A message still in the queue has cost nothing, so `drop(flow)` removes a vanished peer's backlog
without wasting link time on it. In the product the pacer is a server's `max_upload_mbps`. The
benchmarks and tests also give the server and the fetcher an `EmulatedLink` (kernel netem is not
always available), which `p2p-diloco bench member`, `demo` and `bench` hand to the islands they
start; the product's own commands and config never set one. When both are set the slower rate
wins; with neither, the pacer is inactive and the transport sends at once. The pacer only
computes times and holds messages; the socket loop that owns it sends what `pop_due()` releases.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from p2p_diloco.errors import ConfigError


@dataclass(frozen=True)
class EmulatedLink:
    """A WAN link emulated on loopback for what one process sends (benchmarks and tests only)."""

    latency_ms: float = 0.0
    """One-way delay added to every message."""
    bandwidth_mbps: float | None = None
    """Rate of the outgoing link in Mbit/s (None: not limited)."""

    def __post_init__(self) -> None:
        if not 0 <= self.latency_ms <= 10_000:
            raise ConfigError(f"link latency_ms must be in [0, 10000], got {self.latency_ms!r}")
        if self.bandwidth_mbps is not None and not self.bandwidth_mbps > 0:
            raise ConfigError(f"link bandwidth_mbps must be > 0 or unset, got {self.bandwidth_mbps!r}")

    @property
    def emulated(self) -> bool:
        return self.latency_ms > 0 or self.bandwidth_mbps is not None


def link_rate(bandwidth_mbps: float | None, max_upload_mbps: float | None) -> float | None:
    """Bytes per second of the slower of the emulated link and the upload cap (None: unlimited)."""
    rates = [r for r in (bandwidth_mbps, max_upload_mbps) if r is not None]
    return min(rates) * 1e6 / 8 if rates else None


def pacer(link: EmulatedLink | None, max_upload_mbps: float | None = None) -> Pacer:
    """The pacer of a process's uplink: the emulated link's delay and the slower of its rate and the cap."""
    link = link or EmulatedLink()
    return Pacer(link.latency_ms, link_rate(link.bandwidth_mbps, max_upload_mbps))


class Pacer:
    """Holds outgoing messages until the emulated link would have delivered them."""

    def __init__(self, latency_ms: float = 0.0, bytes_per_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert latency_ms >= 0 and (bytes_per_s is None or bytes_per_s > 0)
        self.latency_s = latency_ms / 1000.0
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._free_at = -float("inf")  # when the link finishes the message it is serializing
        self._queues: OrderedDict[Hashable, deque[tuple[float, int, Any]]] = OrderedDict()  # flow -> waiting
        self._wire: list[tuple[float, int, Hashable, Any]] = []  # heap of (arrival, seq, flow, item)
        self._seq = itertools.count()
        self._held: dict[Hashable, int] = {}

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.bytes_per_s is not None

    def __len__(self) -> int:
        return sum(self._held.values())

    def held(self, flow: Hashable) -> int:
        """Messages of `flow` not yet released (queued or on the wire)."""
        return self._held.get(flow, 0)

    def schedule(self, nbytes: int, item: Any, flow: Hashable = None) -> None:
        """Hand a message of `nbytes` to the link now; `pop_due` releases it when it has arrived."""
        now = self._clock()
        self._held[flow] = self._held.get(flow, 0) + 1
        if self.bytes_per_s is None:
            heapq.heappush(self._wire, (now + self.latency_s, next(self._seq), flow, item))
            return
        self._queues.setdefault(flow, deque()).append((now, nbytes, item))
        self._serialize(now)

    def _serialize(self, now: float) -> None:
        """Put queued messages on the wire, round robin over flows, while the link is free by `now`."""
        while self._queues:
            flow, queue = next(iter(self._queues.items()))
            enqueued, nbytes, item = queue[0]
            start = max(self._free_at, enqueued)
            if start > now:
                return
            queue.popleft()
            self._queues.move_to_end(flow)
            if not queue:
                del self._queues[flow]
            self._free_at = start + nbytes / self.bytes_per_s
            heapq.heappush(self._wire, (self._free_at + self.latency_s, next(self._seq), flow, item))

    def next_due(self) -> float | None:
        """The next moment something changes: a message arrives or the link frees up."""
        times = [self._wire[0][0]] if self._wire else []
        if self._queues:
            first = next(iter(self._queues.values()))[0][0]
            times.append(max(self._free_at, first))
        return min(times) if times else None

    def pop_due(self, now: float | None = None) -> list[Any]:
        """Remove and return every message that has arrived by `now`, in arrival order."""
        now = self._clock() if now is None else now
        if self._queues:
            self._serialize(now)
        out = []
        while self._wire and self._wire[0][0] <= now:
            _, _, flow, item = heapq.heappop(self._wire)
            self._release(flow)
            out.append(item)
        return out

    def drop(self, flow: Hashable) -> int:
        """Forget `flow`'s messages still waiting for the link (a peer that left); return how many."""
        queue = self._queues.pop(flow, ())
        for _ in queue:
            self._release(flow)
        return len(queue)

    def clear(self) -> None:
        self._queues.clear()
        self._wire.clear()
        self._held.clear()

    def _release(self, flow: Hashable) -> None:
        self._held[flow] -= 1
        if not self._held[flow]:
            del self._held[flow]
