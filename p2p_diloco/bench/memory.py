"""A process's peak resident memory above a baseline, resettable between the pieces of a measurement
(`bench round`, `bench shard`)."""

from __future__ import annotations

import os
import re
import threading
import time


class PeakMeter:
    """The process's peak RSS above a baseline, resettable between the pieces of a round.

    Reads the kernel's VmHWM after resetting it through /proc/self/clear_refs; where that write is
    refused, samples /proc/self/statm every millisecond from a thread (`method` says which).
    """

    def __init__(self) -> None:
        self.method = "clear_refs" if self._clear_refs() else "sampled"
        self.baseline = rss_bytes()
        self._peak, self._done = self.baseline, threading.Event()
        if self.method == "sampled":
            threading.Thread(target=self._sample, name="rss-sampler", daemon=True).start()

    @staticmethod
    def _clear_refs() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def _sample(self) -> None:
        while not self._done.is_set():
            self._peak = max(self._peak, rss_bytes())
            time.sleep(0.001)

    def take(self) -> int:
        """Peak bytes above the baseline since the last `take` (or the start); starts a new window."""
        if self.method == "clear_refs":
            peak = _status_bytes("VmHWM")
            self._clear_refs()
        else:
            peak, self._peak = max(self._peak, rss_bytes()), rss_bytes()
        return peak - self.baseline

    def close(self) -> None:
        self._done.set()


def rss_bytes() -> int:
    """The process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024
