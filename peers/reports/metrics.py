"""Per-round metrics: one JSON line per round in `metrics.jsonl`, a one-line progress report, and
the link rates an island puts in its discovery record."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from p2p_diloco.peers.reports.sinks import MetricSink

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per round to `<run_dir>/metrics.jsonl`, flushed at once, and hands each
    round's row (a row with a `round`) to its `sinks` (`peers.reports.sinks`: TensorBoard, W&B). A
    sink that fails is said once and dropped: a tracker never stops the training."""

    def __init__(self, run_dir: str | Path, sinks: Sequence[MetricSink] = ()) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)
        self.sinks = list(sinks)

    def write(self, row: dict[str, Any]) -> None:
        row = {"time": round(time.time(), 3), **row}
        self._f.write(json.dumps(row) + "\n")
        if "round" in row:
            for sink in list(self.sinks):
                try:
                    sink.write(row)
                except Exception as e:  # (the row is in metrics.jsonl all the same)
                    log.warning("%s failed (%s: %s); no more rounds go there", type(sink).__name__, type(e).__name__, e)
                    self.sinks.remove(sink)

    def close(self) -> None:
        self._f.close()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                log.warning("closing %s failed: %s: %s", type(sink).__name__, type(e).__name__, e)
        self.sinks = []


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
    partner (`island_label`; "-" for none). It ends with the inner learning rate, the time since the
    first round began, and the share of the budget spent with the time left at this pace."""
    loss = "-" if row.get("loss") is None else f"{row['loss']:.3f}"
    ev = f" eval {row['eval_loss']:.3f}" if row.get("eval_loss") is not None else ""
    lr = f" lr {row['lr']:.2e}" if row.get("lr") is not None else ""
    progress = f" elapsed {duration(row['wall_s'])}" if row.get("wall_s") is not None else ""
    if row.get("budget") is not None:
        progress += f" done {100 * row['budget']:.0f}%"
        progress += f" eta {duration(row['eta_s'])}" if row.get("eta_s") is not None else ""
    out.write(f"[{name}] round {row['round']:>4} v{row['version']:<5} loss {loss}{ev} "
              f"{row['tokens_per_s']:>7.0f} tok/s partner {partner:<8} "
              f"in {row['bytes_in'] / 1e6:6.1f} MB util {row['utilization']:.3f}{lr}{progress}\n")
    out.flush()


def duration(seconds: float) -> str:
    """`42s`, `3m07s`, `1h02m`, `2d03h`: the two most significant units (as the dashboard writes them)."""
    s = max(0, int(seconds))
    if s < 3600:
        return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s < 86400 else f"{s // 86400}d{s % 86400 // 3600:02d}h"


def summary_line(summary: dict[str, Any], out: TextIO = sys.stderr) -> None:
    """One line when an island leaves: its rounds, what its exchanges came to, and why it trained
    alone at the end (or how often it did for a while)."""
    alone = (f"; trained alone: {summary['alone']}" if summary.get("alone") else
             f"; trained alone {summary['alone_episodes']} time(s) for a while" if summary.get("alone_episodes") else "")
    out.write(f"[{summary['name']}] left after {summary['rounds']} rounds: {summary['mixes']} partner states mixed, "
              f"{summary['refused']} refused, {summary['failed_fetches']} fetches failed, "
              f"{summary['too_stale']} too stale to mix{alone}\n")
    out.flush()
