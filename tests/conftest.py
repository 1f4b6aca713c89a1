"""Shared test fixtures: child-process reaping and OS-chosen ports.

Every integration test starts its processes through `spawn`, which records them; the fixture
kills whatever is still alive at the end (SIGKILL after a grace period), so no test leaves
orphans behind even when it fails half-way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One torch thread per process: the suite runs on 2 cores next to the child processes it starts,
# and oversubscribed OpenMP threads make tiny models tens of times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the dashboard's tests do not need torch
    pass

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS reported free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessGroup:
    """Starts child processes in their own sessions and guarantees they are gone at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, args: list[str], **kwargs) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **kwargs.pop("env", {}))
        proc = subprocess.Popen(args, env=env, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, *args: str, **kwargs) -> subprocess.Popen:
        return self.spawn([sys.executable, *args], **kwargs)

    def cleanup(self, grace: float = 5.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)


@pytest.fixture
def procs():
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.cleanup()

