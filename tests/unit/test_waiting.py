"""A HELLO with `want` (protocol 1.1): the server holds it until that version is published, bounded."""

from __future__ import annotations

import time

import pytest
import torch
import zmq

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import TransportTimeout
from p2p_diloco.exchange import parked, wire
from p2p_diloco.exchange.client import Fetcher
from p2p_diloco.exchange.server import SnapshotServer


@pytest.fixture
def srv():
    s = SnapshotServer(config=NetworkConfig(compression="fp32"))
    s.publish({"phi": torch.zeros(1000)}, version=3, tokens=10)
    yield s
    s.close()


@pytest.fixture
def dealers():
    socks = []

    def make(endpoint: str) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    yield make
    for s in socks:
        s.close()


def _next(sock: zmq.Socket, wait_ms: int = 3000) -> wire.Reply:
    assert sock.poll(wait_ms), "no reply from the server"
    return wire.decode_reply(sock.recv_multipart())


def _hello(rid: int, want: int, wait_ms: int = 10_000) -> list:
    return wire.encode(wire.Hello(rid=rid, want=want, wait_ms=wait_ms))


def test_a_hello_waits_for_the_version_it_wants_and_is_answered_when_it_is_published(srv, dealers):
    sock = dealers(srv.endpoint)
    sock.send_multipart(_hello(1, want=4))
    assert _next(sock) == wire.Waiting(rid=1, version=3)  # alive, and holding it
    assert srv.stats()["hellos_waiting"] == 1 and not sock.poll(200)  # nothing more until version 4
    srv.publish({"phi": torch.ones(1000)}, version=4, tokens=20)
    reply = _next(sock)
    assert isinstance(reply, wire.ManifestReply) and reply.rid == 1 and reply.manifest.version == 4
    assert srv.stats()["hellos_waiting"] == 0


def test_a_version_already_published_is_answered_at_once(srv, dealers):
    sock = dealers(srv.endpoint)
    sock.send_multipart(_hello(1, want=3))
    reply = _next(sock)
    assert isinstance(reply, wire.ManifestReply) and reply.manifest.version == 3


def test_when_the_wait_is_over_the_hello_gets_the_version_there_is(srv, dealers):
    sock = dealers(srv.endpoint)
    started = time.monotonic()
    sock.send_multipart(_hello(1, want=9, wait_ms=300))
    assert isinstance(_next(sock), wire.Waiting)
    reply = _next(sock)
    assert isinstance(reply, wire.ManifestReply) and reply.manifest.version == 3
    assert 0.25 < time.monotonic() - started < 2.0


def test_a_server_leaving_answers_the_hellos_that_wait_and_holds_no_more(srv, dealers):
    """An island that finished publishes nothing newer: a partner's final fetch gets its last state now."""
    sock = dealers(srv.endpoint)
    sock.send_multipart(_hello(1, want=9))
    assert isinstance(_next(sock), wire.Waiting)
    sent = srv.sent_within(5.0)
    srv.published_last()
    reply = _next(sock, wait_ms=1000)
    assert isinstance(reply, wire.ManifestReply) and reply.manifest.version == 3
    sock.send_multipart(_hello(2, want=9))
    reply = _next(sock, wait_ms=1000)
    assert isinstance(reply, wire.ManifestReply) and reply.rid == 2 and srv.stats()["hellos_waiting"] == 0
    assert srv.sent_within(5.0) > sent and srv.sent_within(0.0) == 0  # what a leaving island's linger reads


def test_a_connection_holds_one_hello_and_the_server_a_bounded_number(srv, dealers, monkeypatch):
    first = dealers(srv.endpoint)
    first.send_multipart(_hello(1, want=9))
    assert isinstance(_next(first), wire.Waiting)
    first.send_multipart(_hello(2, want=9))  # the older one is answered at once, the newer one held
    replies = [_next(first), _next(first)]
    assert {type(r) for r in replies} == {wire.ManifestReply, wire.Waiting}
    assert [r.rid for r in replies if isinstance(r, wire.ManifestReply)] == [1]
    monkeypatch.setattr(parked, "MAX_PARKED", 1)
    other = dealers(srv.endpoint)
    other.send_multipart(_hello(7, want=9))  # no room: answered as a 1.0 server would, at once
    reply = _next(other)
    assert isinstance(reply, wire.ManifestReply) and reply.rid == 7 and reply.manifest.version == 3
    assert srv.stats()["hellos_waiting"] == 1


def test_a_fetcher_that_wants_a_version_gets_it_and_a_silent_server_costs_only_the_timeout(srv):
    with Fetcher(srv.endpoint, NetworkConfig()) as f:
        started = time.monotonic()
        snap = f.fetch(timeout=2.0, want=9, wait_s=0.3)  # waits 0.3 s, then takes version 3
        assert snap.version == 3 and 0.25 < time.monotonic() - started < 2.0
    endpoint = srv.endpoint
    srv.close()
    with Fetcher(endpoint, NetworkConfig()) as f:
        started = time.monotonic()
        with pytest.raises(TransportTimeout, match="no answer"):
            f.fetch(timeout=0.5, want=9, wait_s=30.0)  # no WAIT came back: the wait is not granted
        assert time.monotonic() - started < 3.0
