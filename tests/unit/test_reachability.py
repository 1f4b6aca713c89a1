"""Islands behind NAT: fixed ports, the dial-back through the rendezvous, outbound-only membership.

Real sockets on 127.0.0.1 with ports chosen by the OS; every wait is on a condition.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import click
import msgpack
import pytest
import zmq
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.cli.join import island_ports
from p2p_diloco.config import DiscoveryConfig, IslandConfig
from p2p_diloco.discovery import reachability
from p2p_diloco.discovery.entries import Entry, MemberTable, SigningKey, decode, encode
from p2p_diloco.discovery.reachability import (
    BUSY, MAX_IN_FLIGHT, Dialback, Dialbacks, ask_dialback, check_reachable, probe, rendezvous_addresses,
    unreachable_message
)
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.discovery.rendezvous import RendezvousServer
from p2p_diloco.discovery.router import Origin
from p2p_diloco.errors import ConfigError, DiscoveryError

pytestmark = pytest.mark.timeout(60)
RELAY = "tcp://203.0.113.1:7003"
MADDR = "/ip4/127.0.0.1/tcp/4100/p2p/QmYunsfm4xYoHz4uJMkxLXo4pXxjcCXHSoV3r3ukZQ1wcE"


def wait_until(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture
def zmq_router():
    """A live ZeroMQ ROUTER: its endpoint."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close()
    ctx.term()


@pytest.fixture
def closed_endpoint():
    """An endpoint where nothing listens (a port the OS handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


class TcpServer:
    """A plain TCP listener that sends `greeting` to every connection (nothing when empty)."""

    def __init__(self, greeting: bytes) -> None:
        self.greeting = greeting
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def http_server():
    server = TcpServer(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    yield server.endpoint
    server.close()


@pytest.fixture
def silent_server():
    server = TcpServer(b"")
    yield server.endpoint
    server.close()


@pytest.fixture
def rendezvous():
    server = RendezvousServer("127.0.0.1", 0, "test-node", relay=RELAY).start()
    yield server
    server.close()


def raw_ask(endpoint: str, payload: bytes, timeout: float = 5.0) -> dict | None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(payload)
        return msgpack.unpackb(sock.recv()) if sock.poll(int(timeout * 1000)) else None
    finally:
        sock.close()
        ctx.term()


# -- probe ----------------------------------------------------------------------------------------

def test_probe_finds_a_zeromq_socket(zmq_router):
    assert probe(zmq_router, 3.0) is None


def test_probe_finds_a_curve_server_without_its_secret():
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_secretkey = zmq.curve_keypair()[1]
    sock.curve_server = True
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        assert probe(f"tcp://127.0.0.1:{port}", 3.0) is None
    finally:
        sock.close()
        ctx.term()


def test_probe_says_why_not(closed_endpoint, http_server, silent_server):
    assert probe(closed_endpoint, 3.0) == "connection refused"
    assert probe(http_server, 3.0) == "something answered but it is not a ZeroMQ socket"
    t0 = time.monotonic()
    assert "sent no ZeroMQ greeting within 0.3 s" in probe(silent_server, 0.3)
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:80", "tcp://127.0.0.1", "tcp://127.0.0.1:0",
                                      "tcp://127.0.0.1:70000", "tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://[::]:1",
                                      "ipc:///tmp/x", 5555, None, "tcp://" + "a" * 300 + ":1"])
def test_probe_refuses_what_it_may_not_dial(endpoint):
    with pytest.raises(ValueError, match="endpoint"):
        probe(endpoint, 1.0)


# -- the rendezvous answers dialback --------------------------------------------------------------

def test_dialback_reports_a_live_and_a_dead_endpoint(rendezvous, zmq_router, closed_endpoint, monkeypatch):
    monkeypatch.setattr(reachability, "RATE_WINDOW_S", 0.0)
    live = ask_dialback(rendezvous.address, zmq_router, "run-1", timeout=5.0)
    assert live == Dialback(True, None, "127.0.0.1", RELAY)
    dead = ask_dialback(rendezvous.address, closed_endpoint, "run-1", timeout=5.0)
    assert dead == Dialback(False, "connection refused", "127.0.0.1", RELAY)
    assert not rendezvous.tables  # a dial-back stores nothing


def test_one_dialback_per_source_address_per_window(rendezvous, zmq_router):
    assert ask_dialback(rendezvous.address, zmq_router, "run-1", timeout=5.0).reachable is True
    again = ask_dialback(rendezvous.address, zmq_router, "run-1", timeout=5.0)
    assert again.reachable is None and again.reason == BUSY
    # the window passes: asked again, it checks
    assert wait_until(lambda: ask_dialback(rendezvous.address, zmq_router, "run-1", 5.0).reachable, 10.0, "a new check")


def test_at_most_four_probes_in_flight(silent_server):
    desk = Dialbacks(probe_timeout=0.5)
    try:
        msg = {"v": 1, "type": "dialback", "run": "r", "endpoint": silent_server}
        started = [desk.answer(msg, Origin(b"id%d" % i, f"10.0.0.{i}")) for i in range(MAX_IN_FLIGHT)]
        assert started == [None] * MAX_IN_FLIGHT and desk.pending == MAX_IN_FLIGHT
        busy = decode(desk.answer(msg, Origin(b"late", "10.0.0.99")))
        assert busy["reachable"] is None and busy["reason"] == BUSY and busy["seen_from"] == "10.0.0.99"
        done: list = []
        wait_until(lambda: done.extend(desk.finished()) or len(done) == MAX_IN_FLIGHT, 10.0, "every probe")
        assert sorted(ident for ident, _ in done) == [b"id%d" % i for i in range(MAX_IN_FLIGHT)]
        assert all(decode(reply)["reachable"] is False for _, reply in done) and desk.pending == 0
        assert desk.answer(msg, Origin(b"next", "10.0.0.99")) is None  # room again
    finally:
        desk.close()


@pytest.mark.parametrize("request_, why", [
    ({"type": "dialback", "run": "r", "endpoint": "http://127.0.0.1:1"}, "endpoint"),
    ({"type": "dialback", "run": "r", "endpoint": "tcp://*:5555"}, "wildcard"),
    ({"type": "dialback", "run": "r", "endpoint": "tcp://127.0.0.1"}, "endpoint"),
    ({"type": "dialback", "run": "bad run!", "endpoint": "tcp://127.0.0.1:1"}, "run id"),
    ({"type": "dialback", "endpoint": "tcp://127.0.0.1:1"}, "exactly"),
    ({"type": "dialback", "run": "r", "endpoint": "tcp://127.0.0.1:1", "extra": 1}, "exactly"),
])
def test_a_malformed_dialback_gets_an_error_and_the_server_keeps_serving(rendezvous, request_, why):
    reply = raw_ask(rendezvous.address, encode(request_))
    assert reply["type"] == "error" and why in reply["reason"]
    sync = raw_ask(rendezvous.address, encode({"type": "sync", "run": "r", "entries": []}))
    assert sync["type"] == "sync" and sync["node"] == "test-node"


def test_asking_nobody_or_an_old_rendezvous_is_not_a_verdict(closed_endpoint, zmq_router):
    silent = ask_dialback(closed_endpoint, zmq_router, "r", timeout=0.3)
    assert silent.reachable is None and "did not answer within 0.3 s" in silent.reason
    old = RendezvousServer("127.0.0.1", 0, "old")
    old._dialbacks.answer = lambda msg, origin: (_ for _ in ()).throw(ValueError("unknown message type 'dialback'"))
    old.start()
    try:
        refused = ask_dialback(old.address, zmq_router, "r", timeout=5.0)
        assert refused.reachable is None and "refused the check: unknown message type" in refused.reason
    finally:
        old.close()


def test_check_reachable_tries_each_rendezvous_until_one_answers(rendezvous, closed_endpoint, zmq_router):
    result = check_reachable((closed_endpoint, rendezvous.address), zmq_router, "run-1", timeout=0.5)
    assert result == Dialback(True, None, "127.0.0.1", RELAY)
    assert check_reachable((), zmq_router, "r").reason == "no bootstrap address to ask"
    assert check_reachable((rendezvous.address,), "tcp://0.0.0.0:1", "r").reachable is None


def test_rendezvous_addresses_are_the_zeromq_fallbacks():
    assert rendezvous_addresses(("tcp://10.0.0.1:7001", MADDR, "tcp://10.0.0.1:7001")) == [
        "tcp://10.0.0.1:7001", "tcp://127.0.0.1:4101"]


def test_the_message_is_one_line_that_says_what_to_open():
    seen = Dialback(False, "timed out after 3 s", "203.0.113.7", None)
    text = unreachable_message("tcp://10.0.0.5:7000", seen, 7000)
    assert "\n" not in text and text.startswith("not reachable from outside")
    assert "tcp://10.0.0.5:7000 (timed out after 3 s; it sees you as 203.0.113.7)" in text
    assert "TCP ports 7000-7002" in text and "--announce 203.0.113.7" in text and "outbound-only" in text
    assert "TCP ports 7000, 7500 and 7002" in unreachable_message("tcp://10.0.0.5:7000", seen, 7000, dht_port=7500)
    assert "Pass --port P" in unreachable_message("tcp://10.0.0.5:40123", seen, 0)
    same = unreachable_message("tcp://203.0.113.7:7000", Dialback(False, "connection refused", "203.0.113.7"), 7000)
    assert "--announce with an address others can reach" in same
    unchecked = unreachable_message("tcp://10.0.0.5:7000", Dialback(None, BUSY), 7000)
    assert unchecked.startswith("could not check") and "--reach outbound" in unchecked and "\n" not in unchecked


# -- the record, the configs and the command line -------------------------------------------------

def test_the_record_carries_reach():
    r = IslandRecord(peer_id="p1", endpoint="tcp://10.0.0.5:7000", reach="outbound")
    assert IslandRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert IslandRecord(peer_id="p1", endpoint="tcp://10.0.0.5:7000").reach == "direct"
    key = SigningKey()
    entry = Entry.make(key, "r", None, time.time() + 30, r.replace(peer_id=key.peer_id))
    table = MemberTable("r")
    assert table.merge([entry.wire()], time.time()) == ([entry], [])
    assert table.entries[key.peer_id].record.reach == "outbound"
    for bad in ("auto", "sideways", None, 1):
        with pytest.raises(DiscoveryError, match="reach"):
            r.replace(reach=bad)


@pytest.mark.parametrize("kw, field", [
    (dict(px_port=70000), "px_port"), (dict(px_port=-1), "px_port"), (dict(px_port=True), "px_port"),
    (dict(port=7001, px_port=7001), "px_port"), (dict(outbound_only=True), "outbound_only"),
    (dict(outbound_only="yes", bootstrap=(MADDR,)), "outbound_only"),
])
def test_discovery_config_checks_the_new_fields(kw, field):
    with pytest.raises(ConfigError, match=f"discovery.{field}"):
        DiscoveryConfig(**kw)


def test_island_config_checks_reach():
    assert IslandConfig().reach == "auto" and IslandConfig(reach="outbound").reach == "outbound"
    with pytest.raises(ConfigError, match="island.reach"):
        IslandConfig(reach="maybe")
    c = DiscoveryConfig(bootstrap=(MADDR,), port=7001, px_port=7002, outbound_only=True)
    assert (c.port, c.px_port, c.outbound_only) == (7001, 7002, True)


def test_join_derives_its_ports_from_one():
    assert island_ports(7000) == (7000, 7001, 7002)
    assert island_ports(0) == (0, 0, 0)
    assert island_ports(7000, 7500) == (7000, 7500, 7002)
    assert island_ports(0, 7500) == (0, 7500, 0)
    assert island_ports(7000, 0) == (7000, 0, 7002)
    for port, dht in ((7000, 7000), (7000, 7002), (65534, None)):
        with pytest.raises(click.BadParameter):
            island_ports(port, dht)


@pytest.mark.parametrize("args, message", [
    (["--port", "65534"], "--port"), (["--reach", "sometimes"], "--reach"),
    (["--reach", "outbound"], "outbound_only"),  # nobody could dial in to join it: it needs a bootstrap node
])
def test_join_refuses_bad_ports_and_reach_before_it_starts(args, message):
    r = CliRunner().invoke(main, ["join", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_join_builds_its_configs_with_the_derived_ports(monkeypatch):
    from p2p_diloco.peers.launch import process

    seen = {}

    def run_island(island, model, train, diloco, network, discovery, *args, **kwargs):
        seen.update(island=island, disc=discovery)
        return 0, {}

    monkeypatch.setattr(process, "run_island", run_island)
    r = CliRunner().invoke(main, ["join", "--bootstrap", MADDR, "--port", "7000", "--reach", "outbound",
                                  "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert (seen["island"].port, seen["island"].reach) == (7000, "outbound")
    assert (seen["disc"].port, seen["disc"].px_port, seen["disc"].outbound_only) == (7001, 7002, True)


# -- the ZeroMQ fallback honours px_port and outbound_only ----------------------------------------

def test_zmq_membership_binds_px_port_and_an_outbound_island_serves_none(rendezvous):
    from p2p_diloco.discovery.peer_exchange import ZmqMembership

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        px_port = s.getsockname()[1]
    base = dict(run_id="nat", bootstrap=(rendezvous.address,), discovery="zmq", poll=0.1, refresh=0.5)
    direct = ZmqMembership(DiscoveryConfig(**base, px_port=px_port))
    outbound = ZmqMembership(DiscoveryConfig(**base, outbound_only=True))
    try:
        assert direct.px == f"tcp://127.0.0.1:{px_port}" and outbound.px is None
        assert probe(direct.px, 3.0) is None
        for m, port in ((direct, 5000), (outbound, 5001)):
            m.announce(IslandRecord(peer_id=m.peer_id, endpoint=f"tcp://127.0.0.1:{port}",
                                    reach="outbound" if m is outbound else "direct"))
        table = wait_until(lambda: (t := rendezvous.tables.get("nat")) and len(t.records(time.time())) == 2 and t,
                           10.0, "both islands at the rendezvous")
        assert table.entries[outbound.peer_id].px is None and table.entries[direct.peer_id].px == direct.px
        # the outbound island still learns of the other through its own syncs
        wait_until(lambda: direct.peer_id in outbound.members(), 10.0, "the outbound island to see the other")
        assert outbound.members()[direct.peer_id].reach == "direct"
    finally:
        direct.shutdown()
        outbound.shutdown()
