"""The ZeroMQ discovery fallback on 127.0.0.1: a swarm of real processes, and in-process islands
(real sockets) for garbage, forged entries and run isolation at the rendezvous and at an island."""

from __future__ import annotations

import subprocess
import sys
import time

import msgpack
import pytest
import zmq
from discovery_harness import (
    SECRET, assert_runs_isolated, assert_swarm_figures, free_port_pair, run_sealed, run_swarm, two_runs
)

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import open_membership
from p2p_diloco.discovery.entries import MAX_MESSAGE_BYTES, Entry, SigningKey
from p2p_diloco.discovery.membership import SEALED_HINT, sealed_hint
from p2p_diloco.discovery.observer import ObserverProcess
from p2p_diloco.discovery.rendezvous import RendezvousServer


@pytest.mark.timeout(180)
def test_swarm_of_eight_over_zmq(procs, tmp_path):
    figures = run_swarm(procs, tmp_path, "zmq")
    print("zmq figures:", figures)
    assert_swarm_figures(figures)


@pytest.mark.timeout(120)
def test_sealed_records_keep_outsiders_out_over_zmq(procs, tmp_path):
    """Under a swarm secret, outsiders reach no member's list and list no member (the rendezvous,
    which holds no secret, keeps and serves every entry as it is)."""
    server = RendezvousServer("127.0.0.1", 0, "test-node").start()
    try:
        figures = run_sealed(procs, tmp_path, "zmq", [server.address])
        print("sealed zmq figures:", figures)
        entries = server.tables["sealed"].entries.values()
        assert sum(e.sealed is not None for e in entries) == 3  # two members and the wrong-secret outsider
        assert all(e.record is None for e in entries if e.sealed is not None)  # it could read none of them
        # the dashboard's reader: hands the secret to its child on stdin, never in argv (`ps` shows argv)
        cfg = dict(run_id="sealed", bootstrap=(server.address,), discovery="zmq", poll=0.25)
        with ObserverProcess(DiscoveryConfig(**cfg, secret=SECRET)) as watcher:
            assert not any(SECRET in arg for arg in watcher._proc.args)
            assert len(watcher.refresh()) == 2 and watcher.sealed_hidden() == 0
        with ObserverProcess(DiscoveryConfig(**cfg)) as blind:
            records = blind.refresh()
            assert blind.sealed_hidden() == 3 and len(records) <= 1  # at most the outsider's plain record
            assert sealed_hint(blind, records) == SEALED_HINT
    finally:
        server.close()


@pytest.fixture
def swarm():
    """A rendezvous and islands A, B of run r1 and C of run r2, in this process."""
    server = RendezvousServer("127.0.0.1", 0, "test-node").start()
    try:
        with two_runs((server.address,), "zmq", 10) as (a, b, c, recs):
            yield server, a, b, c, recs
    finally:
        server.close()


class Raw:
    """A bare DEALER socket: sends whatever bytes a test wants and returns the decoded reply (or None)."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def ask(self, *frames: bytes, timeout: float = 2.0):
        self.sock.send_multipart(list(frames))
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return msgpack.unpackb(self.sock.recv())

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def sync(run: str, entries: list) -> bytes:
    return msgpack.packb({"v": 1, "type": "sync", "run": run, "entries": entries})


@pytest.mark.timeout(60)
def test_runs_sharing_a_rendezvous_do_not_see_each_other(swarm):
    server, a, b, c, recs = swarm
    assert_runs_isolated(a, b, c, recs)
    assert set(server.tables) == {"r1", "r2"}


@pytest.mark.timeout(60)
def test_garbage_and_forgeries_are_refused_and_everyone_keeps_serving(swarm):
    server, a, b, c, recs = swarm
    mallory = SigningKey()
    victim = recs[a.peer_id]
    now = time.time()
    # a valid-looking entry for A's peer id, signed by mallory: the fingerprint does not match
    body = msgpack.packb(["r1", a.peer_id, None, now + 60, {**victim.to_dict(), "endpoint": "tcp://6.6.6.6:1"}])
    stolen = {"b": body, "k": mallory.public, "s": mallory.sign(body)}
    # A's own key bytes with mallory's signature: the signature does not verify
    tomb = msgpack.packb(["r1", a.peer_id, None, now + 60, None])
    bad_sig = {"b": tomb, "k": a._key.public, "s": mallory.sign(tomb)}
    # mallory's own entry, but off the schema or oversized
    mine = victim.replace(peer_id=mallory.peer_id).to_dict()
    off_schema = Entry.make(mallory, "r1", None, now + 60, None).wire()
    off_schema["b"] = msgpack.packb(["r1", mallory.peer_id, None, now + 60, {**mine, "version": -5}])
    off_schema["s"] = mallory.sign(off_schema["b"])
    huge_body = msgpack.packb(["r1", mallory.peer_id, None, now + 60, {**mine, "endpoint": "tcp://" + "a" * 3000 + ":1"}])
    huge = {"b": huge_body, "k": mallory.public, "s": mallory.sign(huge_body)}
    for endpoint in (server.address, a.px):  # the bootstrap's rendezvous and an island's peer exchange
        raw = Raw(endpoint)
        try:
            assert raw.ask(b"\xc1\xc1 not msgpack")["type"] == "error"
            assert raw.ask(msgpack.packb({"v": 2, "type": "sync"}))["type"] == "error"
            assert raw.ask(msgpack.packb({"v": 1, "type": "hello"}))["type"] == "error"
            assert raw.ask(b"two", b"frames") is None  # dropped with a log line
            assert raw.ask(msgpack.packb({"v": 1, "type": "sync", "run": "r1", "entries": 5}))["type"] == "error"
            reply = raw.ask(sync("r1", [stolen, bad_sig, off_schema, huge, {"b": 1}, "junk"]))
            assert reply["type"] == "sync"  # the good part of a request is served, the forged part is not
            got = {Entry.parse(e, "r1", time.time()).peer_id: e for e in reply["entries"]}
            assert set(got) == {a.peer_id, b.peer_id}
            assert Entry.parse(got[a.peer_id], "r1", time.time()).record == victim
        finally:
            raw.close()
        big = Raw(endpoint)  # an oversized message: the socket drops that peer, the server lives on
        try:
            assert big.ask(b"x" * (MAX_MESSAGE_BYTES + 4096), timeout=1.0) is None
        finally:
            big.close()
    for view in (a.refresh(), b.refresh()):
        assert set(view) == {a.peer_id, b.peer_id} and view[a.peer_id] == victim
    probe = Raw(server.address)
    try:
        assert probe.ask(sync("r1", []))["node"] == "test-node"  # still serving after all that
    finally:
        probe.close()


@pytest.mark.timeout(30)
def test_status_against_a_dead_or_malformed_address_fails_readably():
    dead = f"tcp://127.0.0.1:{free_port_pair()}"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "p2p_diloco", "status", "--bootstrap", dead, "--run-id", "x",
                          "--discovery", "zmq", "--timeout", "2"], capture_output=True, text=True, timeout=25)
    took = time.monotonic() - t0
    print(f"dead rendezvous: exit {out.returncode} after {took:.1f} s: {out.stderr.strip()}")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"Error: no rendezvous answered within 2 s (tried {dead})"
    assert took < 2 + 8
    out = subprocess.run([sys.executable, "-m", "p2p_diloco", "status", "--bootstrap", "localhost:80"],
                         capture_output=True, text=True, timeout=25)
    assert out.returncode == 2 and "is not a bootstrap address" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(30)
def test_any_reachable_rendezvous_is_enough(swarm):
    server, a, b, c, recs = swarm
    dead = f"tcp://127.0.0.1:{free_port_pair()}"
    watcher = open_membership(DiscoveryConfig(run_id="r1", bootstrap=(dead, server.address), discovery="zmq",
                                              connect_timeout=3), observer=True)
    try:
        assert set(watcher.refresh()) == {a.peer_id, b.peer_id}
        assert watcher.bootstrap_nodes == {server.address: "test-node"}
    finally:
        watcher.shutdown()


@pytest.mark.timeout(90)
def test_an_observer_process_reports_the_run_and_fails_clearly(swarm):
    """ObserverProcess (the dashboard's reader) sees what an in-process observer sees, refreshes on
    demand, says why it cannot watch, and reports a child that died instead of going stale."""
    import os
    import signal

    from p2p_diloco.discovery.observer import ObserverProcess
    from p2p_diloco.errors import DiscoveryError

    server, a, b, c, recs = swarm
    config = DiscoveryConfig(run_id="r1", bootstrap=(server.address,), discovery="zmq", expiry=8.0, refresh=1.0,
                             poll=0.25)
    watcher = ObserverProcess(config)
    try:
        assert watcher.kind == "zmq"
        members = watcher.refresh(5.0)
        assert members == {a.peer_id: recs[a.peer_id], b.peer_id: recs[b.peer_id]}  # checked again, record by record
        with pytest.raises(DiscoveryError, match="cannot announce"):
            watcher.announce(recs[a.peer_id])
        os.kill(watcher._proc.pid, signal.SIGKILL)
        watcher._proc.wait(10)
        with pytest.raises(DiscoveryError, match="observer process exited"):
            watcher.members()
    finally:
        watcher.shutdown()
        watcher.shutdown()  # idempotent
    dead_port = free_port_pair()
    unreachable = DiscoveryConfig(run_id="r1", bootstrap=(f"tcp://127.0.0.1:{dead_port}",), discovery="zmq",
                                  connect_timeout=0.5)
    with pytest.raises(DiscoveryError, match="no rendezvous answered within 0.5 s"):
        ObserverProcess(unreachable)
