"""Drives a real swarm for the discovery tests: a bootstrap process and member processes.

`Member` reads a `p2p_diloco.bench.lightmember` process's JSON lines on a thread and keeps its events, so a
test can wait for a view and measure, from the members' own timestamps, how long it took.
`Bootstrap` runs `p2p-diloco bootstrap` and reads the addresses it writes to `--addr-file`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

GROUP_EXIT_S = 5.0
"""A member stopped together with its process group exits within this (it leaves without a tombstone)."""
MEMBER = ("-m", "p2p_diloco.bench.lightmember")


def wait_until(cond, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Member:
    def __init__(self, procs, tmp: Path, index: int, bootstrap: list[str], discovery: str, run_id: str,
                 expiry: float, refresh: float, poll: float, endpoint_port: int, secret: str | None = None) -> None:
        args = [*MEMBER, "--run-id", run_id, "--discovery", discovery, "--expiry", str(expiry), "--refresh", str(refresh),
                "--poll", str(poll), "--endpoint-port", str(endpoint_port), "--bump", "2"]
        for b in bootstrap:
            args += ["--bootstrap", b]
        self.log = tmp / f"member{index}.log"
        env = {"P2P_DILOCO_SECRET": secret or ""}  # never the test runner's own secret
        self.proc = procs.python(*args, stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True, env=env)
        self.index = index
        self.events: list[dict] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(event)

    def first(self, event: str, pred=lambda e: True) -> dict | None:
        with self._lock:
            return next((e for e in self.events if e["event"] == event and pred(e)), None)

    def views(self) -> list[set[str]]:
        with self._lock:
            return [set(e["peers"]) for e in self.events if e["event"] == "view"]

    def last_view(self) -> set[str] | None:
        with self._lock:
            views = [e for e in self.events if e["event"] == "view"]
        return set(views[-1]["peers"]) if views else None

    def view_since(self, t0: float, pred) -> dict | None:
        """The first view at or after unix time t0 that satisfies pred(set of peers)."""
        return self.first("view", lambda e: e["t"] >= t0 and pred(set(e["peers"])))

    @property
    def peer_id(self) -> str:
        ready = self.first("ready")
        assert ready is not None, f"member {self.index} is not ready; log:\n{self.log.read_text()[-3000:]}"
        return ready["peer_id"]

    def signal(self, sig: int, group: bool = False) -> float:
        t = time.time()
        (os.killpg if group else os.kill)(self.proc.pid, sig)
        return t


class Bootstrap:
    def __init__(self, procs, tmp: Path, port: int, discovery: str) -> None:
        self.procs, self.tmp, self.port, self.discovery = procs, tmp, port, discovery
        self.identity = tmp / "bootstrap.key"
        self.runs = 0
        self.proc = None

    def start(self, timeout: float = 30.0) -> list[str]:
        self.runs += 1
        addr_file = self.tmp / f"addrs{self.runs}.txt"
        self.log = self.tmp / f"bootstrap{self.runs}.log"
        addr_file.unlink(missing_ok=True)
        self.proc = self.procs.python(
            "-m", "p2p_diloco", "bootstrap", "--host", "127.0.0.1", "--port", str(self.port), "--identity", str(self.identity),
            "--addr-file", str(addr_file), "--discovery", self.discovery,
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        wait_until(lambda: addr_file.exists() or self.proc.poll() is not None, timeout, "the bootstrap's addresses")
        assert self.proc.poll() is None, f"bootstrap died:\n{self.log.read_text()[-3000:]}"
        self.addresses = addr_file.read_text().split()
        return self.addresses

    @property
    def multiaddr(self) -> str:
        return next(a for a in self.addresses if a.startswith("/"))

    @property
    def rendezvous(self) -> str:
        return next(a for a in self.addresses if a.startswith("tcp://"))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout)


def status(bootstrap: list[str], run_id: str, discovery: str, timeout: float = 10.0, as_json: bool = True,
           secret_file: Path | None = None):
    args = [sys.executable, "-m", "p2p_diloco", "status", "--run-id", run_id, "--discovery", discovery, "--timeout", str(timeout)]
    for b in bootstrap:
        args += ["--bootstrap", b]
    if as_json:
        args.append("--json")
    if secret_file is not None:
        args += ["--secret-file", str(secret_file)]
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2P_DILOCO_SECRET")}
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 30, env=env)
    return out, time.monotonic() - t0


def free_port_pair() -> int:
    """A port P with P+1 free as well (the bootstrap's DHT port and its rendezvous port)."""
    import socket

    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no free pair of ports")


def departure_times(members: list[Member], peer_id: str, t0: float, timeout: float) -> list[float]:
    """Seconds from t0 until each member's view lost `peer_id` (waits up to `timeout`)."""
    wait_until(lambda: all(m.view_since(t0, lambda v: peer_id not in v) for m in members), timeout,
               f"every member to drop {peer_id}")
    return [m.view_since(t0, lambda v: peer_id not in v)["t"] - t0 for m in members]


def run_swarm(procs, tmp: Path, kind: str, *, n: int = 8, expiry: float = 6.0, refresh: float = 2.0,
              poll: float = 0.5, run_id: str = "swarm") -> dict:
    """The scenario both back-ends must pass; returns the measured figures (seconds).

    bootstrap + n members meet -> one member exits cleanly -> one is SIGKILLed -> the bootstrap is
    SIGKILLed for longer than the expiry (the survivors keep seeing each other) -> it restarts with
    the same identity and port, the survivors re-find it, and `status --json` through it lists them.
    """
    boot = Bootstrap(procs, tmp, free_port_pair(), "auto" if kind == "dht" else "zmq")
    boot.start()
    entry = [boot.multiaddr if kind == "dht" else boot.rendezvous]
    first_node = node_id(boot, kind)
    t_spawn = time.time()
    members = [Member(procs, tmp, i, entry, kind, run_id, expiry, refresh, poll, 20000 + i) for i in range(n)]
    wait_until(lambda: all(m.first("ready") or m.proc.poll() is not None for m in members), 120, "members to start")
    for m in members:
        assert m.first("ready"), f"member {m.index} died:\n{m.log.read_text()[-3000:]}"
        assert m.first("ready")["kind"] == kind
    ids = {m.peer_id for m in members}
    last_ready = max(m.first("ready")["t"] for m in members)
    wait_until(lambda: all(m.view_since(0, lambda v: v == ids) for m in members), 30, "every member to see all")
    figures = {"startup_s": last_ready - t_spawn,
               "join_all_s": max(m.view_since(0, lambda v: v == ids)["t"] for m in members) - last_ready}

    leaver, victim, rest = members[0], members[1], members[2:]
    t0 = leaver.signal(signal.SIGTERM)
    figures["clean_exit_s"] = max(departure_times([victim, *rest], leaver.peer_id, t0, 10))
    assert leaver.proc.wait(10) == 0 and leaver.first("left")
    figures["tombstone_stored_s"] = leaver.first("left")["t"] - t0

    t0 = victim.signal(signal.SIGKILL, group=True)
    figures["sigkill_s"] = max(departure_times(rest, victim.peer_id, t0, expiry + 10))

    # SIGTERM to a member's whole process group (a terminal's Ctrl+C, killpg): the DHT process stops
    # with it, and the member must still leave at once rather than wait on it (it waited 15 s)
    grouped, rest = rest[-1], rest[:-1]
    t0 = grouped.signal(signal.SIGTERM, group=True)
    assert grouped.proc.wait(GROUP_EXIT_S) == 0 and grouped.first("left"), "a member stopped with its group hung"
    figures["group_exit_s"] = time.time() - t0

    survivors = {m.peer_id for m in rest}
    os.killpg(boot.proc.pid, signal.SIGKILL)
    boot.proc.wait(10)
    t_down = time.time()
    time.sleep(expiry + 2)
    for m in rest:  # nobody lost sight of a survivor while the bootstrap was gone
        assert not m.view_since(t_down, lambda v: not survivors <= v), f"member {m.index} lost peers"
        assert m.last_view() == survivors
    figures["bootstrap_down_s"] = time.time() - t_down

    t_restart = time.time()
    boot.start()
    t_up = time.time()
    figures["restart_s"] = t_up - t_restart  # until it printed its addresses
    assert node_id(boot, kind) == first_node
    # members re-find the restarted node: it logs each of them (DHT routing table / rendezvous registry)
    mark = re.compile(r"DHT peer \S+ joined" if kind == "dht" else r"rendezvous: island \S+ joined run")
    wait_until(lambda: len(mark.findall(boot.log.read_text())) >= len(survivors), 30, "the survivors to re-find the bootstrap")
    figures["refind_s"] = time.time() - t_up  # after it printed its addresses

    out, figures["status_s"] = status(entry, run_id, kind)  # status --json through the restarted node
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["run_id"] == run_id and snap["discovery"] == kind
    assert {r["peer_id"] for r in snap["islands"]} == survivors
    by_id = {m.peer_id: m for m in rest}
    for r in snap["islands"]:
        assert r["endpoint"] == f"tcp://127.0.0.1:{20000 + by_id[r['peer_id']].index}"
        assert r["state"] == "training" and r["version"] >= 1 and r["tokens"] == 4096 * r["version"]
    figures["bootstrap_peer_id"] = first_node
    return figures


def node_id(boot: Bootstrap, kind: str) -> str:
    """The bootstrap's peer id: from its multiaddr (DHT) or from a rendezvous reply (ZeroMQ)."""
    if kind == "dht":
        return boot.multiaddr.rsplit("/p2p/", 1)[1]
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(boot.rendezvous)
    try:
        sock.send(msgpack.packb({"v": 1, "type": "sync", "run": "probe", "entries": []}))
        assert sock.poll(5000), "the rendezvous did not answer"
        return msgpack.unpackb(sock.recv())["node"]
    finally:
        sock.close()
        ctx.term()


def assert_swarm_figures(figures: dict, expiry: float = 6.0) -> None:
    """The discovery issue's figures: all see all within 10 s, a clean exit gone within 2 s, a
    SIGKILLed member gone within the expiry time (plus one poll)."""
    assert figures["join_all_s"] <= 10.0
    assert figures["clean_exit_s"] <= 2.0
    assert figures["sigkill_s"] <= expiry + 0.5


def announce(membership, port: int):
    """Announce a minimal training record for `membership` on 127.0.0.1:port; returns it."""
    from p2p_diloco.discovery.records import IslandRecord

    rec = IslandRecord(peer_id=membership.peer_id, endpoint=f"tcp://127.0.0.1:{port}", state="training",
                       timestamp=time.time())
    membership.announce(rec)
    return rec


@contextlib.contextmanager
def two_runs(bootstrap: tuple[str, ...], discovery: str, meet_timeout: float):
    """Islands A and B of run r1 and C of run r2 in this process, announced and met; yields
    (a, b, c, records by peer id) and shuts them down afterwards."""
    from p2p_diloco.config import DiscoveryConfig
    from p2p_diloco.discovery import open_membership

    cfg = dict(bootstrap=bootstrap, discovery=discovery, expiry=8.0, refresh=1.0, poll=0.25)
    a, b = (open_membership(DiscoveryConfig(run_id="r1", **cfg)) for _ in range(2))
    c = open_membership(DiscoveryConfig(run_id="r2", **cfg))
    try:
        recs = {m.peer_id: announce(m, 6000 + i) for i, m in enumerate((a, b, c))}
        wait_until(lambda: len(a.members()) == len(b.members()) == 2, meet_timeout, "A and B to meet")
        yield a, b, c, recs
    finally:
        for m in (a, b, c):
            m.shutdown()


def assert_runs_isolated(a, b, c, recs: dict) -> None:
    """A and B (run r1) see exactly each other, with the records announced; C (run r2) only itself."""
    assert set(a.refresh()) == set(b.refresh()) == {a.peer_id, b.peer_id}
    assert set(c.refresh()) == {c.peer_id}
    assert a.members()[b.peer_id] == recs[b.peer_id]


SECRET = "correct horse battery staple"


def run_sealed(procs, tmp: Path, kind: str, entry: list[str], *, run_id: str = "sealed", expiry: float = 6.0,
               refresh: float = 1.0, poll: float = 0.25) -> dict:
    """Discovery under a swarm secret, the scenario both back-ends must pass; returns figures (seconds).

    Two members hold the secret; two outsiders announce records through the same bootstrap node:
    one holds no secret (its record is plain), one holds another (its record is sealed, but does not
    open). The members see exactly each other and drop both outsiders' records (and count them);
    neither outsider ever lists a member; `status` without the secret lists nobody and says why,
    with it (from a file) it lists the two members.
    """
    t0 = time.time()
    honest = [Member(procs, tmp, 100 + i, entry, kind, run_id, expiry, refresh, poll, 21000 + i, secret=SECRET)
              for i in range(2)]
    outsiders = [Member(procs, tmp, 102, entry, kind, run_id, expiry, refresh, poll, 21002, secret=None),
                 Member(procs, tmp, 103, entry, kind, run_id, expiry, refresh, poll, 21003, secret="a wrong guess")]
    everyone = honest + outsiders
    wait_until(lambda: all(m.first("ready") or m.proc.poll() is not None for m in everyone), 120, "members to start")
    for m in everyone:
        assert m.first("ready"), f"member {m.index} died:\n{m.log.read_text()[-3000:]}"
    ids = {m.peer_id for m in honest}
    wait_until(lambda: all(m.view_since(0, lambda v: v == ids) for m in honest), 30, "the members to see each other")
    figures = {"meet_s": max(m.view_since(0, lambda v: v == ids)["t"] for m in honest) - t0}
    # every member dropped an outsider's record, each outsider saw sealed records it cannot use
    wait_until(lambda: all(m.first("sealed", lambda e: e["refused"] > 0) for m in honest), 20,
               "the members to drop an outsider's record")
    wait_until(lambda: outsiders[0].first("sealed", lambda e: e["hidden"] > 0), 20, "the outsider to see sealed records")
    wait_until(lambda: outsiders[1].first("sealed", lambda e: e["refused"] > 0), 20,
               "the wrong-secret outsider to drop records")
    time.sleep(4 * poll)  # a few more reads, in which an outsider's record would have shown up
    for m in honest:
        assert all(v <= ids for v in m.views()), f"an outsider reached member {m.index}: {m.views()}"
        assert m.last_view() == ids
    for m in outsiders:
        assert all(v <= {m.peer_id} for v in m.views()), f"outsider {m.index} listed a member: {m.views()}"
    figures["dropped_s"] = time.time() - t0

    secret_file = tmp / "swarm.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both at once: each one starts a DHT node
        blind = pool.submit(status, entry, run_id, kind)
        seeing = pool.submit(status, entry, run_id, kind, secret_file=secret_file)
        (out, figures["status_plain_s"]), (out_secret, figures["status_secret_s"]) = blind.result(), seeing.result()
    assert out.returncode == 0, out.stderr  # sees the plain outsider at most
    assert {r["peer_id"] for r in json.loads(out.stdout)["islands"]} <= {outsiders[0].peer_id}
    assert out.stderr.strip().splitlines()[-1] == "records are sealed with a swarm secret; pass --secret or --secret-file"
    out = out_secret
    assert out.returncode == 0, out.stderr
    assert {r["peer_id"] for r in json.loads(out.stdout)["islands"]} == ids
    assert "Warning" not in out.stderr
    return figures
