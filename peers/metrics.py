"""Per-round metrics: one JSON line per round in `metrics.jsonl`, and a one-line progress report."""

from __future__ import annotations

import json
import sys
import time
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


def progress_line(name: str, row: dict[str, Any], out: TextIO = sys.stderr) -> None:
    """One readable line per round, for terminals and logs alike."""
    partner = row.get("partner") or "-"
    ev = f" eval {row['eval_loss']:.3f}" if row.get("eval_loss") is not None else ""
    out.write(f"[{name}] round {row['round']:>4} v{row['version']:<5} loss {row['loss']:.3f}{ev} "
              f"{row['tokens_per_s']:>7.0f} tok/s partner {partner[:8]:<8} "
              f"in {row['bytes_in'] / 1e6:6.1f} MB util {row['utilization']:.3f}\n")
    out.flush()
