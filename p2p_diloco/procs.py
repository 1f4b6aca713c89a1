"""This machine's processes, as Linux's /proc lists them (plain Python; where there is no /proc, none).

Read by a DHT process looking for the daemon it started (`discovery.dhtnode.OwnedDHT`), and by the
benches that count an island's process tree (`bench discovery`) or what its session left (`bench churn`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """One process: its state letter (`Z`: a zombie), its parent and its session."""

    pid: int
    state: str
    ppid: int
    session: int


def read(pid: int) -> Proc | None:
    """Process `pid`, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid, _pgrp, session = stat[stat.rindex(")") + 2:].split()[:4]  # (the command may hold spaces)
    return Proc(pid, state, int(ppid), int(session))


def processes() -> list[Proc]:
    """Every process there is now, zombies included."""
    if not os.path.isdir("/proc"):
        return []
    return [p for entry in os.listdir("/proc") if entry.isdigit() and (p := read(int(entry))) is not None]


def alive(pid: int) -> bool:
    """Process `pid` is there and not a zombie."""
    return (p := read(pid)) is not None and p.state != "Z"


def command(pid: int) -> str:
    """Process `pid`'s command line ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
