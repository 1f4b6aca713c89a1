"""Fuzzing a live snapshot server in another process with thousands of malformed requests.

Each case is sent on a bare DEALER socket followed by a sentinel HELLO; the server must answer the
case exactly as the reference decoder (`wire.decode_request`) predicts: one ERROR with the right
code for anything invalid, a MANIFEST for a valid HELLO. Afterwards the server must still serve a
correct fetch, must have counted every rejection, and its memory must not have grown.
"""

from __future__ import annotations

import random

import msgpack
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transport_peer import make_state, start_server

from p2p_diloco.errors import ProtocolError, ProtocolMismatch
from p2p_diloco.exchange import wire
from p2p_diloco.exchange.client import fetch

pytestmark = pytest.mark.timeout(240)
SENTINEL = 2**62


class Prober:
    """Sends one case plus a sentinel HELLO and returns the replies to the case."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock = self._open()
        self.sentinel = wire.encode(wire.Hello(rid=SENTINEL))

    def _open(self) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self.endpoint)
        return sock

    def probe(self, frames: list[bytes]) -> list[wire.Reply]:
        self.sock.send_multipart(frames)
        self.sock.send_multipart(self.sentinel)
        replies = []
        while True:
            assert self.sock.poll(10_000), "the server stopped answering"
            reply = wire.decode_reply(self.sock.recv_multipart())  # the server only ever sends valid replies
            if isinstance(reply, wire.ManifestReply) and reply.rid == SENTINEL:
                return replies
            replies.append(reply)

    def check(self, frames: list[bytes]) -> bool:
        """Probe one case and assert the server's answer; True when the case was invalid."""
        replies = self.probe(frames)
        try:
            req = wire.decode_request(frames)
        except ProtocolMismatch:
            assert [(type(r), r.code) for r in replies] == [(wire.ErrorReply, "version")]
            return True
        except ProtocolError:
            assert [(type(r), r.code) for r in replies] == [(wire.ErrorReply, "bad_request")], frames
            return True
        assert replies, frames
        if isinstance(req, wire.Hello):
            assert isinstance(replies[0], wire.ManifestReply) and replies[0].rid == req.rid
            assert all(isinstance(r, wire.ChunkReply) for r in replies[1:])
        else:
            assert len(replies) == 1 and replies[0].rid == req.rid
        return False


def _h(**fields) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=30),
                     st.binary(max_size=60))
_any = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                    max_leaves=12)
_fields = st.fixed_dictionaries(
    {"v": st.sampled_from([[1, 0], [1, 0], [1, 5], [2, 0], [0, 0], [1], "1.0"]),
     "t": st.sampled_from(["hello", "get", "get", "manifest", "error", "chunk", "", "hellö", "push", "put"])},
    optional={"rid": st.integers(-3, 2**63) | _any, "sid": st.integers(-3, 2**63) | _any,
              "off": st.integers(-3, 2**51) | _any, "len": st.integers(-3, 2**24) | _any,
              "prefetch": st.integers(-3, 2**20) | _any, "chunk": st.integers(-3, 2**24) | _any, "junk": _any})
_frame = st.one_of(_fields.map(lambda d: _h(**d)), _any.map(lambda d: _h(x=d)), st.binary(max_size=200))


_POOL = [None, True, -1, 0, 1, 7, 2**31, 2**63 - 1, 2**64 - 1, 1.5, float("nan"), "", "x", "hello", b"\x00" * 9,
         [], [1, 0], [2, 0], {}, {"a": 1}]


def _random_frames(rng: random.Random, valid: list[bytes]) -> list[bytes]:
    kind = rng.randrange(5)
    if kind == 0:  # random bytes
        return [rng.randbytes(rng.randrange(1, 300))]
    if kind == 1:  # a valid request cut short
        f = rng.choice(valid)
        return [f[: rng.randrange(1, len(f))]]
    if kind == 2:  # a valid request with flipped bits
        f = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 4)):
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        return [bytes(f)]
    if kind == 3:  # a header whose fields are drawn from plausible and implausible values
        d = msgpack.unpackb(rng.choice(valid))
        for key in rng.sample(["v", "t", "rid", "sid", "off", "len", "prefetch", "chunk", "extra"], rng.randrange(1, 4)):
            if rng.random() < 0.2:
                d.pop(key, None)
            else:
                d[key] = rng.choice(_POOL)
        return [msgpack.packb(d, use_bin_type=True)]
    return [rng.choice(valid) for _ in range(rng.randrange(2, 5))]  # extra frames


def test_fuzzed_requests_are_rejected_and_the_server_keeps_serving(procs):
    peer, endpoint = start_server(procs, "--numel", "100000")
    probe = Prober(endpoint)
    hello = wire.encode(wire.Hello(rid=1))[0]
    manifest = probe.probe([hello])[0].manifest
    valid = [hello, wire.encode(wire.GetChunk(rid=2, sid=manifest.sid, offset=0, length=manifest.block))[0],
             wire.encode(wire.Hello(rid=3, prefetch=2 * manifest.block, chunk=manifest.block))[0]]
    rss_before = peer.cmd("stats")["rss"]
    counted = {"invalid": 0, "cases": 0}

    @settings(max_examples=500, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(frames=st.lists(_frame, min_size=1, max_size=3))
    def fuzz(frames):
        counted["cases"] += 1
        counted["invalid"] += probe.check(frames)

    fuzz()
    rng = random.Random(0)
    for _ in range(4000):
        counted["cases"] += 1
        counted["invalid"] += probe.check(_random_frames(rng, valid))
    # a request over 4096 bytes that is no push offer is refused; past the socket's limit (a push's
    # 1 MiB plus slack) the connection is cut before anything parses it
    assert probe.check([b"\x81" * (wire.MAX_REQUEST_BYTES + 1)])
    assert probe.check([b"\x81" * (wire.MAX_REQUEST_BYTES + wire.FRAME_OVERHEAD + 1)])
    for size in (wire.MAX_OFFER_BYTES + wire.FRAME_OVERHEAD + 1, 4 << 20):
        probe.sock.send(b"\x81" * size)
        assert not probe.sock.poll(300)
        probe.sock.close()
        probe.sock = probe._open()
    chunk = probe.probe([valid[1]])  # still answering correct requests
    assert isinstance(chunk[0], wire.ChunkReply) and chunk[0].length == manifest.block

    stats = peer.cmd("stats")
    assert counted["cases"] >= 4500 and counted["invalid"] >= 3500
    assert sum(stats["rejected"].values()) >= counted["invalid"]
    assert stats["rss"] - rss_before < 32 * 2**20
    snap = fetch(endpoint, timeout=30)
    assert torch.equal(snap.tensors["phi"], make_state(100_000, 1)["phi"])
    probe.sock.close()
