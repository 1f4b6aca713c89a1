"""Fixtures of the dashboard tests: a live swarm on 127.0.0.1 and a helper to wait on a running app.

`LiveSwarm` is a bootstrap process plus island processes. Islands are started by `ISLAND`, which
today runs `p2p_diloco.bench.lightmember` (a real discovery member whose record's version
grows every few seconds). To watch real training islands instead, point `ISLAND` at a function
with the same signature that starts `p2p-diloco join` and returns an object with `.proc` (the
Popen) and `.peer_id` (available once the island has announced itself) -- one line to change.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from discovery_harness import Bootstrap, Member, free_port_pair, wait_until  # noqa: E402
from p2p_diloco.tui.source import MembershipSource  # noqa: E402

from p2p_diloco.config import DiscoveryConfig  # noqa: E402

EXPIRY = 4.0
"""Record lifetime in the live tests: a killed island must be shown gone within this (plus a poll)."""
REFRESH = 0.5


def member_island(procs, tmp: Path, index: int, entry: list[str], kind: str, run_id: str):
    """A discovery member process announcing under `run_id` through `entry`."""
    return Member(procs, tmp, index, entry, kind, run_id, expiry=EXPIRY, refresh=REFRESH, poll=REFRESH,
                  endpoint_port=21000 + index)


ISLAND = member_island


class LiveSwarm:
    """A bootstrap node and islands of one run, all child processes of the test."""

    def __init__(self, procs, tmp: Path, kind: str, run_id: str = "tui") -> None:
        self.procs, self.tmp, self.kind, self.run_id = procs, tmp, kind, run_id
        self.bootstrap = Bootstrap(procs, tmp, free_port_pair(), "auto" if kind == "dht" else "zmq")
        self.islands: list = []
        self.entry: list[str] = []

    def start_bootstrap(self) -> list[str]:
        self.bootstrap.start()
        self.entry = [self.bootstrap.multiaddr if self.kind == "dht" else self.bootstrap.rendezvous]
        return self.entry

    def rendezvous_address(self) -> str:
        """The rendezvous address the bootstrap will have (known before it starts)."""
        return f"tcp://127.0.0.1:{self.bootstrap.port + 1}"

    def add_islands(self, n: int, timeout: float = 90.0) -> list:
        new = [ISLAND(self.procs, self.tmp, len(self.islands) + i, self.entry, self.kind, self.run_id) for i in range(n)]
        self.islands += new
        wait_until(lambda: all(i.first("ready") or i.proc.poll() is not None for i in new), timeout, "islands to start")
        for island in new:
            assert island.first("ready"), f"island {island.index} died:\n{island.log.read_text()[-3000:]}"
        return new

    def kill(self, island) -> float:
        """SIGKILL an island's whole process group (no goodbye); returns the time it was killed."""
        t = time.monotonic()
        os.killpg(island.proc.pid, signal.SIGKILL)
        island.proc.wait(10)
        return t

    def config(self, entry: list[str] | None = None, **fields) -> DiscoveryConfig:
        fields.setdefault("connect_timeout", 5.0)
        return DiscoveryConfig(run_id=self.run_id, bootstrap=tuple(entry or self.entry), discovery=self.kind,
                               expiry=EXPIRY, refresh=REFRESH, poll=REFRESH, **fields)

    def source(self, entry: list[str] | None = None, **fields) -> MembershipSource:
        return MembershipSource(self.config(entry, **fields), retry=0.5)


@pytest.fixture
def zmq_swarm(procs, tmp_path):
    return LiveSwarm(procs, tmp_path, "zmq")


@pytest.fixture
def dht_swarm(procs, tmp_path):
    return LiveSwarm(procs, tmp_path, "dht")


async def until(pilot, cond, timeout: float, what: str):
    """Let the app run until `cond()` is truthy; returns its value (fails the test after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def run_app(coro_fn, app, size=(120, 36)):
    """Run `coro_fn(pilot)` against `app` headless at `size` (the tests are plain, not async)."""

    async def main():
        async with app.run_test(size=size) as pilot:
            await coro_fn(pilot)

    asyncio.run(main())
