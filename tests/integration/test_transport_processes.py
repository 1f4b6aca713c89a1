"""The transport between real processes on 127.0.0.1: faults, races, secrets and memory.

The server runs in a child process (`transport_peer.py serve`); the test process fetches, or a
second child does. Faults are injected with signals: SIGKILL mid-transfer on either side, SIGSTOP
for a stalled server. Slow transfers come from the transport's own link emulation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from discovery_harness import wait_until
from transport_peer import Peer, make_state, start_server

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import AuthRefused, ConnectionLost, TransportTimeout
from p2p_diloco.exchange.client import fetch, fetch_manifest

pytestmark = pytest.mark.timeout(120)


def _fetch_in_thread(endpoint: str, cfg: NetworkConfig, timeout: float = 30.0):
    box: dict = {}

    def run():
        try:
            box["snap"] = fetch(endpoint, cfg, timeout=timeout)
        except Exception as e:  # the test inspects what was raised
            box["error"] = e
        box["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, box


def _wait_mid_transfer(peer: Peer, total: int, sent: int = 2**20) -> None:
    """Wait until the server has put `sent` bytes of a transfer on its (emulated) link, and check
    that the transfer of `total` bytes is still going: the moment a fault is injected."""
    stats = wait_until(lambda: (st := peer.cmd("stats"))["bytes_sent"] >= sent and st, 30,
                       f"the server to send the first {sent} bytes of the transfer")
    assert stats["bytes_sent"] < total, f"the transfer was over before the fault: {stats}"


def test_fetch_across_processes_returns_exactly_what_was_published(procs):
    _, endpoint = start_server(procs, "--numel", "300000", "--version", "4")
    m = fetch_manifest(endpoint, timeout=30)
    assert (m.version, m.tokens) == (4, 4000) and [t.name for t in m.tensors] == ["phi", "m"]
    snap = fetch(endpoint, timeout=30)
    for name, t in make_state(300_000, 4).items():
        assert torch.equal(snap.tensors[name], t)


def test_server_killed_mid_transfer_fails_the_fetch_fast_and_whole(procs):
    # 6 MB over an emulated 20 Mbit/s link: about 2.4 s of transfer to interrupt
    peer, endpoint = start_server(procs, "--numel", "1000000", "--bandwidth-mbps", "20")
    t, box = _fetch_in_thread(endpoint, NetworkConfig(), timeout=30)
    _wait_mid_transfer(peer, 6_000_000)
    killed = time.monotonic()
    os.kill(peer.proc.pid, signal.SIGKILL)
    t.join(40)
    assert "snap" not in box and isinstance(box["error"], ConnectionLost)
    assert box["at"] - killed < 3.0  # noticed from the closed connection, not from a timeout


def test_fetcher_killed_mid_transfer_leaves_the_server_serving(procs):
    peer, endpoint = start_server(procs, "--numel", "1000000", "--bandwidth-mbps", "20")
    fetcher = Peer(procs, "fetch", endpoint)  # a second child process
    assert fetcher.next()["event"] == "start"
    _wait_mid_transfer(peer, 6_000_000)  # the child is mid-transfer
    os.kill(fetcher.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    snap = fetch(endpoint, timeout=30)
    assert torch.equal(snap.tensors["phi"], make_state(1_000_000, 1)["phi"])
    # the dead fetcher's queued chunks were dropped, not sent into the void at 20 Mbit/s first
    assert time.monotonic() - t0 < 2.4 + 3.0
    assert peer.cmd("stats")["manifests_served"] == 2


def test_stalled_server_times_out(procs):
    peer, endpoint = start_server(procs, "--numel", "1000000", "--bandwidth-mbps", "40")
    t, box = _fetch_in_thread(endpoint, NetworkConfig(), timeout=1.0)
    _wait_mid_transfer(peer, 6_000_000)
    os.kill(peer.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    t.join(30)
    os.kill(peer.proc.pid, signal.SIGCONT)
    assert isinstance(box["error"], TransportTimeout) and "middle of a transfer" in str(box["error"])
    assert 0.9 <= box["at"] - stopped < 4.0


@pytest.mark.parametrize("retain", [2, 1])
def test_publish_while_fetching_gives_the_old_version_whole(procs, retain):
    # 15 MB at an emulated 60 Mbit/s: 2 s, longer than the first window (8 MiB) takes. The snapshot
    # being read stays served after the publish, even with retain 1 (exchange/shelf.py)
    peer, endpoint = start_server(procs, "--numel", "2500000", "--bandwidth-mbps", "60", "--retain", str(retain))
    t, box = _fetch_in_thread(endpoint, NetworkConfig(), timeout=30)
    _wait_mid_transfer(peer, 15_000_000)  # the chunks past the first window are mostly still to be asked for
    assert peer.cmd("publish 2") == {"published": 2}
    t.join(60)
    assert box["snap"].version == 1
    for name, tensor in make_state(2_500_000, 1).items():
        assert torch.equal(box["snap"].tensors[name], tensor)
    assert fetch(endpoint, timeout=30).version == 2


def test_a_fetch_on_a_slow_link_completes_while_newer_versions_are_published(procs):
    # 360 kB (fp32) at an emulated 0.5 Mbit/s: 6 s, over a timeout of 2 s (a first chunk of 1 MiB
    # took longer than that), while the server publishes a new version every 0.25 s (with one
    # snapshot retained, the one being read stays served: exchange/shelf.py)
    peer, endpoint = start_server(procs, "--numel", "60000", "--bandwidth-mbps", "0.5", "--retain", "1")
    t, box = _fetch_in_thread(endpoint, NetworkConfig(), timeout=2.0)
    _wait_mid_transfer(peer, 360_000, sent=1)  # the fetch of version 1 began
    version = 1
    while t.is_alive() and version < 200:
        version += 1
        assert peer.cmd(f"publish {version}") == {"published": version}
        t.join(0.25)
    assert "error" not in box, box.get("error")
    assert box["snap"].version == 1 and box["snap"].seconds > 4.0 and version > 10
    for name, tensor in make_state(60_000, 1).items():
        assert torch.equal(box["snap"].tensors[name], tensor)
    assert peer.cmd("stats")["snapshots_held"] == 1  # its reader is done: only the newest is held


def test_client_without_the_secret_is_refused(procs):
    peer, endpoint = start_server(procs, "--secret", "swarm-7f3a")
    for secret in (None, "not-the-secret"):
        with pytest.raises(AuthRefused):
            fetch(endpoint, NetworkConfig(), timeout=10, secret=secret)
        with pytest.raises(AuthRefused):
            fetch_manifest(endpoint, NetworkConfig(), timeout=10, secret=secret)
    snap = fetch(endpoint, NetworkConfig(), timeout=30, secret="swarm-7f3a")
    assert torch.equal(snap.tensors["m"], make_state(100_000, 1)["m"])
    # the server counts refusals from its socket monitor, a moment later
    stats = wait_until(lambda: (st := peer.cmd("stats"))["auth_refused"] >= 4 and st, 5,
                       "the server to count the 4 refused handshakes")
    assert stats["manifests_served"] == 1, stats  # nothing reached the protocol


def test_fetcher_peak_memory_is_the_state_plus_the_window(procs):
    _, endpoint = start_server(procs, "--numel", "10000000")  # 60 MB of fp32 state
    out = subprocess.run([sys.executable, "-m", "p2p_diloco.bench.transport", "memory", endpoint],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    mem = json.loads(out.stdout)
    assert mem["state_bytes"] == 60_000_000
    checking = 3 * 8 * 2**20  # up to three received chunks wait for their digest check
    slack = 8 * 2**20  # allocator arenas and interpreter
    bound = mem["state_bytes"] + mem["peak_window_bytes"] + checking + slack
    assert mem["state_bytes"] * 0.9 <= mem["peak_extra_bytes"] <= bound, mem
