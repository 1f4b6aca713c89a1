"""One island per run directory: a lock file holding its owner's pid.

Two islands given the same `run_dir` (or both left at the default) would interleave their
`metrics.jsonl`, overwrite each other's `island.json` and share one checkpoint tree, so that a later
`--resume` could load the other island's state. An island therefore takes `<run_dir>/island.lock`
before it writes anything there: an exclusive `flock` on the file, held while the island lives,
with the owner's pid written in it for the error message. The kernel releases the lock when its
process ends, however it ends (`kill -9` included), so a lock left by a dead island is never
mistaken for a live one: the next island takes it over, with a warning naming the old pid.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from p2p_diloco.errors import ConfigError

log = logging.getLogger(__name__)
LOCK_NAME = "island.lock"


class RunDirInUse(ConfigError):
    """Another live island holds the run directory."""


class RunDirLock:
    """The lock on one run directory (see the module docstring); `release` (or the process's end) frees it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_pid(fd)
            os.close(fd)
            raise RunDirInUse(f"run directory {self.path.parent} is in use by the island of process "
                              f"{owner or '(unknown)'} ({self.path}); give each island its own run directory "
                              "(--run-dir, or IslandConfig(run_dir=...))") from None
        stale = _read_pid(fd)
        if stale is not None and stale != os.getpid():
            log.warning("run directory %s: taking over the lock of process %d, which has ended", self.path.parent, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def __del__(self) -> None:  # an island whose start failed half-way frees its directory with it
        self.release()

    def release(self) -> None:
        """Free the directory (the lock file goes; safe to call twice)."""
        if getattr(self, "_fd", None) is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    except (OSError, ValueError):
        return None
