"""Snapshot server and fetcher in one process: round trips, errors, secret, pacing, bad requests."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import torch
import zmq

from p2p_diloco.config import NetworkConfig
from p2p_diloco.core import codecs
from p2p_diloco.errors import AuthRefused, BadPayload, ProtocolMismatch, TransportError, TransportTimeout
from p2p_diloco.exchange import wire
from p2p_diloco.exchange.client import Fetcher, fetch, fetch_manifest
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.exchange.server import SnapshotServer


def _state(seed: int = 0, n: int = 50_000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"phi": torch.randn(n, generator=g), "m": torch.randn(4, n // 8, generator=g)}


@pytest.fixture
def server():
    servers = []

    def make(secret=None, link=None, **cfg) -> SnapshotServer:
        s = SnapshotServer(config=NetworkConfig(**{"compression": "fp32", **cfg}), secret=secret, link=link)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def _ask(endpoint: str, frames: list[bytes], wait_ms: int = 2000) -> wire.Reply | None:
    """Send raw frames on a bare DEALER; return the decoded reply, or None if none came."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        if not sock.poll(wait_ms):
            return None
        return wire.decode_reply(sock.recv_multipart())
    finally:
        sock.close()


def _eventually(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _hdr(**d) -> bytes:
    return msgpack.packb({"v": [1, 0], **d}, use_bin_type=True)


@pytest.mark.parametrize("codec", ["fp32", "bf16", "fp16", "int8", "int4"])
def test_fetch_returns_the_published_state(server, codec):
    srv = server(compression=codec)
    state = _state()
    srv.publish(state, version=5, tokens=1234, meta={"loss": 3.25, "island": "a"})
    snap = fetch(srv.endpoint, NetworkConfig(), timeout=10)
    assert (snap.version, snap.tokens, snap.meta) == (5, 1234, {"loss": 3.25, "island": "a"})
    encoded = sum(codecs.encoded_nbytes(t.numel(), codec) for t in state.values())
    assert encoded <= snap.nbytes < encoded + wire.ALIGN * len(state)  # plus alignment padding
    for name, t in state.items():
        assert torch.equal(snap.tensors[name], codecs.roundtrip(t.reshape(-1), codec).view(t.shape))
    stats = srv.stats()
    assert stats["payload_bytes_sent"] == snap.nbytes and stats["bytes_sent"] > snap.nbytes
    assert stats["manifests_served"] == 1 and stats["chunks_served"] == snap.stats.chunks


def test_manifest_alone_is_cheap_and_a_new_publish_replaces_the_old(server):
    srv = server()
    srv.publish(_state(1), version=1, tokens=10)
    m = fetch_manifest(srv.endpoint, timeout=10)
    assert (m.version, m.tokens) == (1, 10) and srv.stats()["chunks_served"] == 0
    with Fetcher(srv.endpoint) as f:
        assert f.fetch(10).version == 1
        srv.publish(_state(2), version=2, tokens=20)
        snap = f.fetch(10)  # the same connection, reused
    assert snap.version == 2 and torch.equal(snap.tensors["phi"], _state(2)["phi"])


def test_nothing_published_yet(server):
    srv = server()
    with pytest.raises(TransportError, match="nothing published yet"):
        fetch(srv.endpoint, timeout=5)


def test_other_protocol_versions_are_refused_both_ways(server):
    srv = server()
    srv.publish(_state(), version=1, tokens=0)
    reply = _ask(srv.endpoint, [msgpack.packb({"v": [2, 0], "t": "hello", "rid": 3})])
    assert isinstance(reply, wire.ErrorReply) and reply.code == "version" and reply.rid == 3
    assert "1.1" in reply.message and "2.0" in reply.message
    # a server from the future: its replies carry major 2
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    port = fake.bind_to_random_port("tcp://127.0.0.1")

    def answer():
        if fake.poll(5000):
            ident, _ = fake.recv_multipart()
            fake.send_multipart([ident, msgpack.packb({"v": [2, 0], "t": "manifest", "rid": 1})])

    t = threading.Thread(target=answer)
    t.start()
    with pytest.raises(ProtocolMismatch, match="2.0"):
        fetch(f"tcp://127.0.0.1:{port}", timeout=5)
    t.join()
    fake.close(0)


def test_bad_requests_get_an_error_and_the_server_keeps_serving(server):
    srv = server()
    m = srv.publish(_state(), version=1, tokens=0)
    cases = [
        ([b"\xc1garbage"], "bad_request"),
        ([_hdr(t="hello", rid=1, prefetch=0, chunk=0), b"extra frame"], "bad_request"),
        ([_hdr(t="launch", rid=1)], "bad_request"),
        ([_hdr(t="get", rid=2, sid=12345, off=0, len=wire.MIN_CHUNK)], "gone"),
        ([_hdr(t="get", rid=3, sid=m.sid, off=1, len=wire.MIN_CHUNK)], "bad_request"),
        ([_hdr(t="get", rid=4, sid=m.sid, off=0, len=wire.MIN_CHUNK - 1)], "bad_request"),
        ([_hdr(t="get", rid=5, sid=m.sid, off=m.total, len=wire.MIN_CHUNK)], "bad_request"),
    ]
    for frames, code in cases:
        reply = _ask(srv.endpoint, frames)
        assert isinstance(reply, wire.ErrorReply) and reply.code == code, frames
        assert reply.version == 1
    over = _ask(srv.endpoint, [b"x" * (wire.MAX_REQUEST_BYTES + 1)])  # measured, never parsed
    assert over.code == "bad_request" and "exceeds" in over.message
    huge = [b"x" * (wire.MAX_OFFER_BYTES + wire.FRAME_OVERHEAD + 1)]
    assert _ask(srv.endpoint, huge, wait_ms=300) is None  # the socket drops the connection unread
    assert _eventually(lambda: srv.stats()["rejected"] == {"bad_request": 7, "gone": 1})
    assert fetch(srv.endpoint, timeout=10).version == 1


def test_secret_admits_only_peers_that_hold_it(server):
    srv = server(secret="correct horse")
    big = {"phi": torch.randn(6_000_000)}  # 24 MB: full 8 MiB chunks, each a little larger once encrypted
    srv.publish(big, version=3, tokens=0)
    full = NetworkConfig(min_chunk_bytes=wire.MAX_CHUNK, max_chunk_bytes=wire.MAX_CHUNK)
    snap = fetch(srv.endpoint, full, timeout=10, secret="correct horse")
    assert snap.version == 3 and torch.equal(snap.tensors["phi"], big["phi"])
    assert snap.stats.chunk_bytes == wire.MAX_CHUNK
    for secret in (None, "battery staple"):
        with pytest.raises(AuthRefused, match="secret"):
            fetch(srv.endpoint, NetworkConfig(), timeout=10, secret=secret)
    assert _eventually(lambda: srv.stats()["auth_refused"] >= 2)  # counted by the server's monitor thread
    assert srv.stats()["manifests_served"] == 1
    plain = server()
    plain.publish(_state(), version=1, tokens=0)
    with pytest.raises(AuthRefused):  # we have a secret, the server has none
        fetch(plain.endpoint, NetworkConfig(), timeout=10, secret="correct horse")


def test_silent_peer_times_out():
    sock = zmq.Context.instance().socket(zmq.ROUTER)  # accepts, never answers
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    t0 = time.monotonic()
    with pytest.raises(TransportTimeout, match="no answer"):
        fetch(f"tcp://127.0.0.1:{port}", timeout=0.5)
    assert 0.45 <= time.monotonic() - t0 < 3
    sock.close(0)


def test_corrupted_snapshot_is_refused_by_the_fetcher(server):
    srv = server()
    srv.publish(_state(), version=1, tokens=0)
    srv._latest.buf[70_000] ^= 0x55  # fault injection: the served bytes no longer match the digests
    with pytest.raises(BadPayload, match="digest mismatch in block 1"):
        fetch(srv.endpoint, timeout=10)


def test_upload_cap_and_emulated_latency_pace_the_exchange(server):
    srv = server(max_upload_mbps=40)  # 1 MB takes 0.2 s
    srv.publish({"phi": torch.randn(250_000)}, version=1, tokens=0)
    snap = fetch(srv.endpoint, timeout=10)
    assert 0.2 <= snap.seconds < 2.0 and snap.stats.link_bytes_per_s <= 5.5e6 * 1.1
    link = EmulatedLink(latency_ms=30)
    slow = server(link=link)
    slow.publish(_state(), version=1, tokens=0)
    t0 = time.monotonic()
    with Fetcher(slow.endpoint, link=link) as f:
        f.manifest(10)
    assert 0.06 <= time.monotonic() - t0 < 1.0  # one round trip: 30 ms each way
    assert 0.06 <= fetch(slow.endpoint, timeout=10, link=link).stats.rtt_s < 0.5


def test_concurrent_fetchers_all_get_the_whole_state(server):
    srv = server()
    state = _state(n=200_000)
    srv.publish(state, version=9, tokens=0)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(fetch(srv.endpoint, timeout=20))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    assert all(torch.equal(r.tensors["phi"], state["phi"]) for r in results)


def test_closed_server_fails_fetches_fast_and_close_is_idempotent(server):
    srv = server()
    srv.publish(_state(), version=1, tokens=0)
    endpoint = srv.endpoint
    srv.close()
    srv.close()
    with pytest.raises(TransportError):
        fetch(endpoint, timeout=0.5)


def test_endpoint_announces_another_host_and_the_os_chosen_port(server):
    srv = SnapshotServer("tcp://127.0.0.1:0", NetworkConfig(), announce_host="island-7.example")
    try:
        host_port = srv.endpoint.rsplit(":", 1)
        assert host_port[0] == "tcp://island-7.example" and int(host_port[1]) > 0
    finally:
        srv.close()


def test_a_client_past_the_request_limit_is_told_busy_even_without_link_emulation(server):
    srv = server()
    m = srv.publish({"phi": torch.randn(16_384)}, version=1, tokens=0)  # one 64 KiB block
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.endpoint)
    try:
        n = 2_499  # pipelined, none read: far past the 256 the protocol allows
        for rid in range(1, n + 1):
            sock.send_multipart(wire.encode(wire.GetChunk(rid=rid, sid=m.sid, offset=0, length=m.block)))
        assert _eventually(lambda: srv.stats()["requests"] == n, timeout=20)
        replies = []
        while sock.poll(2000):
            replies.append(wire.decode_reply(sock.recv_multipart(copy=False)))
        busy = [r for r in replies if isinstance(r, wire.ErrorReply) and r.code == "busy"]
        chunks = [r for r in replies if isinstance(r, wire.ChunkReply)]
        assert busy and chunks and len(busy) + len(chunks) == len(replies) <= n
        assert {r.rid for r in replies} <= set(range(1, n + 1))
    finally:
        sock.close()
    assert fetch(srv.endpoint, timeout=10).version == 1  # and it serves the next client as before


@pytest.mark.parametrize("numel", [1000, 842_000, 3_000_000])
def test_the_bytes_a_fetch_moves_are_what_the_simulator_charges(server, numel):
    """`exchange.cost.fetch_wire_bytes` (what the simulator counts per fetch) is, byte for byte, what a
    first fetch sends and receives: HELLO, MANIFEST, prefetched CHUNKs, then GETs and CHUNKs."""
    from p2p_diloco.exchange.cost import REPRESENTATIVE_META, fetch_wire_bytes

    srv = server(compression="int8")
    state = {"phi": torch.randn(numel), "m": torch.randn(numel)}
    srv.publish(state, version=3, tokens=40_000, meta=REPRESENTATIVE_META, codec_of={"m": "int4"})
    snap = fetch(srv.endpoint, NetworkConfig(), timeout=10)
    expected = fetch_wire_bytes([("phi", numel, "int8"), ("m", numel, "int4")], version=3, tokens=40_000)
    assert snap.wire_bytes == expected and 0 < expected - snap.nbytes < 600 + snap.nbytes // 500


def test_a_state_larger_than_max_state_bytes_is_refused_before_anything_is_allocated(server):
    """The bound is on what the fetch allocates: the decoded fp32 tensors, or with `decode=False`
    the encoded bytes it keeps (a public state's updates: 28 sign updates of a 1B model decode to
    112 GB but arrive in 4 GB)."""
    srv = server(compression="int8")
    srv.publish({"phi": torch.randn(10_000)}, version=1, tokens=1)  # 10,160 bytes encoded, 40,000 decoded
    cfg = NetworkConfig(max_state_bytes=20_000)
    with pytest.raises(BadPayload, match="over max_state_bytes"):
        fetch(srv.endpoint, cfg, timeout=10)
    assert fetch(srv.endpoint, cfg, timeout=10, decode=False).nbytes == 10_160
