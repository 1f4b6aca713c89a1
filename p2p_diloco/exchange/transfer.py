"""One fetch's progress (`exchange.client.Fetcher`): the chunk requests in flight, the received chunks
awaiting their digest check, and the data rate its chunks' arrivals show."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from p2p_diloco.exchange import wire

VERIFY_BACKLOG = 2
"""Chunks beyond the newest that may wait for their digest check (memory: the window + 3 chunks)."""


@dataclass
class Transfer:
    """One fetch's progress: the chunk requests in flight and the received chunks awaiting their check."""

    inflight: deque
    """(offset, length, rid, sent at, or None for a chunk the HELLO prefetched), in request order."""
    next_off: int
    """Offset of the next chunk to ask for."""
    in_bytes: int
    """Bytes asked for and not yet received."""
    stall: float
    """The fetch fails if no chunk arrives before this monotonic time."""
    chunks: int = 0
    verifying: deque = field(default_factory=deque)
    """Digest and finiteness checks running on the verify thread, oldest first."""
    first_at: float | None = None
    """When the first chunk arrived (monotonic), and its bytes: the data rate is measured after it."""
    first_n: int = 0
    last_at: float = 0.0
    received: int = 0

    def arrived(self, n: int, now: float) -> None:
        if self.first_at is None:
            self.first_at, self.first_n = now, n
        self.last_at, self.received = now, self.received + n

    def data_rate(self) -> float:
        """Bytes per second between the first chunk's arrival and the last one's (NaN before a second)."""
        span = self.last_at - self.first_at if self.first_at is not None else 0.0
        return (self.received - self.first_n) / span if span > 0 else math.nan

    @classmethod
    def after(cls, hello: wire.Hello, m: wire.Manifest, stall: float) -> Transfer:
        """The transfer as the HELLO left it: the server streams its prefetched chunks unasked."""
        inflight = deque((off, n, hello.rid, None) for off, n in wire.prefetch_plan(m.total, m.block, hello.prefetch,
                                                                                    hello.chunk))
        next_off = inflight[-1][0] + inflight[-1][1] if inflight else 0
        return cls(inflight=inflight, next_off=next_off, in_bytes=next_off, stall=stall)

    def collect_done(self) -> None:
        """Take the results of the checks that have finished (raises what a failed one found)."""
        while self.verifying and self.verifying[0].done():
            self.verifying.popleft().result()  # raises BadPayload if the chunk failed its check

    def collect_down_to(self, backlog: int) -> None:
        """Wait for the oldest checks until at most `backlog` are still running."""
        while len(self.verifying) > backlog:
            self.verifying.popleft().result()
