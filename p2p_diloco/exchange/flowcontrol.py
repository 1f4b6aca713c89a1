"""Bandwidth-aware chunking: how big a chunk to ask for and how many bytes to keep in flight.

A fetch keeps `window` bytes requested but not yet received. To fill a link the window must cover
its bandwidth-delay product (BDP); a larger window only adds memory and queueing. Like TCP BBR,
the controller keeps two estimates per link: the minimum round-trip time seen (the propagation
delay without queueing) and the highest recent delivery rate (the bottleneck bandwidth; chunks
that arrive back to back arrive at the bottleneck's rate). Then

    window = clamp(GAIN * bandwidth * min_rtt, 3 chunks, max_window)
    chunk  = clamp(bandwidth * CHUNK_SECONDS, min_chunk, max_chunk)   (a multiple of the block)

so a fast local link gets few large chunks (little per-message overhead) and a slow link small
ones (fine-grained progress), and the window holds at least three chunks for pipelining. A link
not measured yet gets the smallest chunks: a fetch's timeout counts silence between chunks, and a
chunk sized for a fast link could take longer than that on a slow one (1 MiB at 0.5 Mbit/s: 17 s);
after a few arrivals the chunks grow to the measured rate. Estimates
are remembered per endpoint, so the next fetch from the same partner starts with the right window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

GAIN = 2.0  # window / BDP: headroom for chunk serialization and rate noise
CHUNK_SECONDS = 0.008  # target time one chunk occupies the link
MIN_SAMPLE_S = 0.002  # a delivery-rate sample must span at least this long
SAMPLE_ARRIVALS = 4  # ... and this many chunk arrivals, to average out scheduling jitter
RATE_MEMORY_S = 2.0  # the bandwidth estimate is the max of the samples of this long
_REMEMBERED = 256


@dataclass(frozen=True)
class LinkEstimate:
    rtt_s: float
    bytes_per_s: float


_estimates: OrderedDict[str, LinkEstimate] = OrderedDict()
_lock = threading.Lock()


SILENCE_CHUNKS = 4
"""A fetch over a slow link may hear nothing for this many chunks' time at its rate (`WindowController.silence_s`)."""


def remembered(endpoint: str) -> LinkEstimate | None:
    with _lock:
        return _estimates.get(endpoint)


def remember(endpoint: str, est: LinkEstimate | None) -> None:
    if est is None:
        return
    with _lock:
        _estimates[endpoint] = est
        _estimates.move_to_end(endpoint)
        while len(_estimates) > _REMEMBERED:
            _estimates.popitem(last=False)


class WindowController:
    """Chunk size and window for one fetch, updated from RTT and delivery samples."""

    def __init__(self, *, min_chunk: int, max_chunk: int, initial_window: int, max_window: int,
                 prior: LinkEstimate | None = None) -> None:
        self.min_chunk, self.max_chunk = min_chunk, max_chunk
        self.initial_window, self.max_window = initial_window, max_window
        self.min_rtt = math.inf
        """The smallest round trip this fetch saw."""
        self._prior_rtt = prior.rtt_s if prior else math.inf
        self._prior_bw = prior.bytes_per_s if prior else 0.0
        self._samples: deque[tuple[float, float]] = deque()  # (time, rate) for the max filter
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=64)  # (time, cumulative bytes)
        self._delivered = 0
        self.peak_window = 0

    @classmethod
    def for_config(cls, cfg, prior: LinkEstimate | None = None) -> WindowController:
        """A fetch's controller with a `NetworkConfig`'s chunk and window bounds."""
        return cls(min_chunk=cfg.min_chunk_bytes, max_chunk=cfg.max_chunk_bytes, initial_window=cfg.initial_window_bytes,
                   max_window=cfg.max_window_bytes, prior=prior)

    @property
    def bandwidth(self) -> float:
        """Bytes/s: the highest recent delivery rate (or the remembered one before any sample)."""
        return max((r for _, r in self._samples), default=self._prior_bw)

    @property
    def rtt(self) -> float:
        """Seconds: the smallest round trip this fetch saw, or the remembered one before any sample (a
        remembered one only seeds the window: the peer at an endpoint, or its path, may have changed)."""
        return self.min_rtt if math.isfinite(self.min_rtt) else self._prior_rtt

    def on_rtt(self, seconds: float) -> None:
        if seconds > 0:
            self.min_rtt = min(self.min_rtt, seconds)

    def on_delivery(self, nbytes: int, now: float | None = None) -> None:
        """Record that `nbytes` arrived now; take a delivery-rate sample when enough time has passed."""
        now = time.monotonic() if now is None else now
        self._delivered += nbytes
        start = None
        for i, (t, cum) in enumerate(reversed(self._arrivals)):  # newest first: the latest one far enough back
            if i + 1 >= SAMPLE_ARRIVALS and now - t >= MIN_SAMPLE_S:
                start = (t, cum)
                break
        self._arrivals.append((now, self._delivered))
        if start is not None:
            self._samples.append((now, (self._delivered - start[1]) / (now - start[0])))
        while self._samples and now - self._samples[0][0] > RATE_MEMORY_S:
            self._samples.popleft()

    def chunk_bytes(self, block: int) -> int:
        """Chunk length to request: a multiple of `block` within the configured bounds."""
        bw = self.bandwidth
        want = bw * CHUNK_SECONDS if bw > 0 else 0  # not measured yet: the smallest
        lo = max(block, self.min_chunk - self.min_chunk % block)
        hi = max(lo, self.max_chunk - self.max_chunk % block)
        c = 1 << max(0, int(want).bit_length() - 1)  # a power of two, like the block
        return min(hi, max(lo, c - c % block))

    def silence_s(self, timeout: float, block: int, rate_hint: float = 0.0) -> float:
        """How long a fetch may hear nothing: `timeout`, or `SILENCE_CHUNKS` chunks' time at the link's
        rate where that is longer (this link's, else `rate_hint`, bytes per second: what the caller
        measured of its partners' links): on a slow uplink that serves other fetches too, one 64 KiB
        chunk can take longer than `timeout`."""
        rate = self.bandwidth or rate_hint
        return timeout if rate <= 0 else max(timeout, SILENCE_CHUNKS * self.chunk_bytes(block) / rate)

    def window_bytes(self, block: int) -> int:
        """Bytes to keep requested but not yet received."""
        chunk = self.chunk_bytes(block)
        if self.bandwidth > 0 and math.isfinite(self.rtt):
            w = max(GAIN * self.bandwidth * self.rtt, 3 * chunk)
        else:
            w = max(self.initial_window, 3 * chunk)
        w = int(max(chunk, min(w, self.max_window)))
        self.peak_window = max(self.peak_window, w)
        return w

    def estimate(self) -> LinkEstimate | None:
        if self.bandwidth > 0 and math.isfinite(self.rtt):
            return LinkEstimate(rtt_s=self.rtt, bytes_per_s=self.bandwidth)
        return None
