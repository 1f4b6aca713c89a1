"""Per-round metrics: one JSON line per round in `metrics.jsonl`, a one-line progress report, and
the link rates an island puts in its discovery record."""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO


class MetricsLog:
    """Appends one JSON object per round to `<run_dir>/metrics.jsonl`, flushed at once."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps({"time": round(time.time(), 3), **row}) + "\n")

    def close(self) -> None:
        self._f.close()


class LinkRates:
    """Upload and download rates averaged over the last `window_s` seconds.

    Gossip moves one snapshot per round in a burst of a fraction of a second, so a rate over the
    few seconds between two records would read zero most of the time; over a window of several
    rounds it says what the island's links carry, which is what the dashboard shows and what the
    partner chooser uses to spread load.
    """

    def __init__(self, window_s: float = 30.0, now: float | None = None) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int, int]] = deque([(time.monotonic() if now is None else now, 0, 0)])

    def update(self, now: float, sent: int, received: int) -> tuple[float, float]:
        """Record the byte counters at `now`; returns (upload, download) bytes per second."""
        samples = self._samples
        samples.append((now, sent, received))
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()  # keep one sample at or before the window's start
        t0, sent0, received0 = samples[0]
        span = max(now - t0, 1.0)
        return (sent - sent0) / span, (received - received0) / span


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's `metrics.jsonl` (a torn last line from a crash is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def progress_line(name: str, row: dict[str, Any], partner: str = "-", out: TextIO = sys.stderr) -> None:
    """One readable line per round, for terminals and logs alike; `partner`: the label of the round's
    partner (`island_label`; "-" for none)."""
    ev = f" eval {row['eval_loss']:.3f}" if row.get("eval_loss") is not None else ""
    out.write(f"[{name}] round {row['round']:>4} v{row['version']:<5} loss {row['loss']:.3f}{ev} "
              f"{row['tokens_per_s']:>7.0f} tok/s partner {partner:<8} "
              f"in {row['bytes_in'] / 1e6:6.1f} MB util {row['utilization']:.3f}\n")
    out.flush()


def summary_line(summary: dict[str, Any], out: TextIO = sys.stderr) -> None:
    """One line when an island leaves: its rounds, what its exchanges came to, and why it trained
    alone at the end (or how often it did for a while)."""
    alone = (f"; trained alone: {summary['alone']}" if summary.get("alone") else
             f"; trained alone {summary['alone_episodes']} time(s) for a while" if summary.get("alone_episodes") else "")
    out.write(f"[{summary['name']}] left after {summary['rounds']} rounds: {summary['mixes']} partner states mixed, "
              f"{summary['refused']} refused, {summary['failed_fetches']} fetches failed, "
              f"{summary['too_stale']} too stale to mix{alone}\n")
    out.flush()
