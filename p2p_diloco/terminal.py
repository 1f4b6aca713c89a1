"""The process's terminal: what a process does when it is closed under it (plain Python, no torch)."""

from __future__ import annotations

import os
import stat


def leave_terminal() -> None:
    """After a hangup, point stdout and stderr, when they are a (closed) terminal, at /dev/null:
    every write to a closed terminal fails, and a last line must not turn a clean exit into a crash
    (the dashboard's, or an island's progress line: `peers/launch/process.py`, `tui/launch.py`)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)
