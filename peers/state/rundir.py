"""One island per run directory (a lock file holding its owner's pid), and nothing of an earlier run lost there.

Two islands given the same `run_dir` (or both left at the default) would interleave their
`metrics.jsonl`, overwrite each other's `island.json` and share one checkpoint tree, so that a later
`--resume` could load the other island's state. An island therefore takes `<run_dir>/island.lock`
before it writes anything there: an exclusive `flock` on the file, held while the island lives,
with the owner's pid written in it for the error message. The kernel releases the lock when its
process ends, however it ends (`kill -9` included), so a lock left by a dead island is never
mistaken for a live one: the next island takes it over, with a warning naming the old pid.

Nothing of an earlier run is lost on a second start (`prepare_run_dir`, under the lock): an island
that does not resume refuses a directory that holds checkpoints unless it is asked to start afresh,
which moves the earlier run's files (`EARLIER_RUN`) into `previous-<time>/` beside them (renamed,
nothing deleted); an island asked to resume fails at once where there is no checkpoint. A path
that cannot be a run directory (a file, a folder under a file, one this user cannot write) is a
one-line `RunDirError` too. `check_run_dir` says the same without the lock and without changing
anything, for `join` before it builds the island.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from p2p_diloco.errors import ConfigError

log = logging.getLogger(__name__)
LOCK_NAME = "island.lock"
CHECKPOINTS = "checkpoints"
"""The run directory's folder of checkpoints (`peers.state.checkpoint`: `ckpt-*/` and `latest`)."""
EARLIER_RUN = (CHECKPOINTS, "metrics.jsonl", "island.json", "tokenizer.json", "tensorboard", "wandb")
"""What an island writes in its run directory, moved aside together by a fresh start (the tokenizer
its checkpoints name, `peers.state.modelfiles`, with them: the folder they go to is a run directory)."""
PREVIOUS = "previous-"
"""The prefix of the folders an earlier run is moved into (`previous-20250101-120000`)."""


class RunDirError(ConfigError):
    """The run directory cannot be used as asked: a path problem, or an earlier run's checkpoints."""


class RunDirInUse(RunDirError):
    """Another live island holds the run directory."""


class RunDirLock:
    """The lock on one run directory (see the module docstring); `release` (or the process's end) frees it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = usable(run_dir) / LOCK_NAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"run directory {self.path.parent} cannot be used: {e.strerror or e}") from None
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


def usable(run_dir: str | Path) -> Path:
    """`run_dir`, when an island can make it and write in it; else a one-line `RunDirError` (a file, a
    folder under a file, no permission). Nothing is created."""
    path = Path(run_dir)
    try:
        folder = next(f for f in (path, *path.parents) if f.exists())
        is_dir = folder.is_dir()
    except OSError as e:  # (a name too long, a loop of links...)
        raise RunDirError(f"run directory {path} cannot be used: {e.strerror or e}") from None
    if not is_dir:
        where = "is a file" if folder == path else f"would be made under {folder}, which is a file"
        raise RunDirError(f"run directory {path} {where}: give a folder (--run-dir, or IslandConfig(run_dir=...))")
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK if folder == path else os.W_OK | os.X_OK):
        where = "" if folder == path else f" cannot be made in {folder}:"
        raise RunDirError(f"run directory {path}{where} this user may not write there (give another --run-dir, or "
                          "change its permissions)")
    return path


def holds_checkpoints(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds an earlier run's checkpoints (`checkpoints/latest` or a `ckpt-*` folder)."""
    folder = Path(run_dir) / CHECKPOINTS
    try:
        return (folder / "latest").exists() or any(p.name.startswith("ckpt-") for p in folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise RunDirError(f"cannot read {folder}: {e.strerror or e}") from None


def check_run_dir(run_dir: str | Path, *, resume: bool, fresh: bool = False) -> Path:
    """`run_dir` if an island may start there as asked (see the module docstring), else a one-line
    `RunDirError`; changes nothing."""
    path = usable(run_dir)
    held = holds_checkpoints(path)
    if resume and not held:
        raise RunDirError(f"nothing to resume: {path / CHECKPOINTS} holds no checkpoint (start without --resume, "
                          "or give the run directory that holds one)")
    if held and not (resume or fresh):
        raise RunDirError(f"run directory {path} holds the checkpoints of an earlier run: continue it with --resume "
                          f"(IslandConfig(resume=True)), or start afresh with --fresh (fresh=True), which moves it "
                          f"aside into {path / PREVIOUS}<time>/, or give another run directory")
    return path


def prepare_run_dir(run_dir: str | Path, *, resume: bool, fresh: bool = False) -> Path | None:
    """`check_run_dir`, then with `fresh` the earlier run moved aside (`move_aside`); call it holding
    the directory's lock. Returns where the earlier run went (None: nothing was moved)."""
    check_run_dir(run_dir, resume=resume, fresh=fresh)
    return move_aside(run_dir) if fresh else None


def move_aside(run_dir: str | Path) -> Path | None:
    """Rename the earlier run's files (`EARLIER_RUN`) in `run_dir` into a new `previous-<time>/` there;
    nothing is copied or deleted. Returns that folder (None when there was nothing to move)."""
    path = Path(run_dir)
    earlier = [path / name for name in EARLIER_RUN if os.path.lexists(path / name)]
    if not earlier:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = path / f"{PREVIOUS}{stamp}", 1
    while os.path.lexists(dest):
        dest, n = path / f"{PREVIOUS}{stamp}-{n}", n + 1
    try:
        dest.mkdir()
        for item in earlier:
            os.rename(item, dest / item.name)
    except OSError as e:
        raise RunDirError(f"cannot move the earlier run in {path} aside into {dest}: {e.strerror or e}") from None
    log.warning("%s: the earlier run (%s) moved aside into %s", path, ", ".join(i.name for i in earlier), dest)
    return dest
