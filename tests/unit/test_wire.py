"""The wire protocol on its own: message round trips, limits, versions, and rejection of bad input."""

from __future__ import annotations

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p_diloco.errors import ProtocolError, ProtocolMismatch
from p2p_diloco.exchange import payload, wire


def _manifest(**tensors) -> wire.Manifest:
    m, _ = payload.pack(tensors or {"phi": torch.randn(1000), "m": torch.randn(3, 7)}, "fp32",
                        version=4, tokens=123, meta={"loss": 2.5, "peer": "a"})
    return m


def _pack(d) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


def test_every_message_round_trips_and_carries_the_version():
    m = _manifest()
    requests = [wire.Hello(rid=1), wire.Hello(rid=2, prefetch=1 << 20, chunk=wire.MIN_CHUNK),
                wire.GetChunk(rid=3, sid=m.sid, offset=0, length=4000),
                wire.Hello(rid=4, pub=True, chain="c1", since=3, want=5, wait_ms=wire.MAX_WAIT_MS)]
    for msg in requests:
        frames = wire.encode(msg)
        assert msgpack.unpackb(frames[0])["v"] == list(wire.PROTOCOL_VERSION)
        assert wire.decode_request(frames) == msg
    body = bytes(range(256)) * 4
    replies = [wire.ManifestReply(rid=1, manifest=m), wire.ErrorReply(rid=2, code="gone", message="x", version=9),
               wire.ChunkReply(rid=3, sid=m.sid, offset=0, length=len(body), payload=body),
               wire.Waiting(rid=4, version=-1)]
    for msg in replies:
        frames = wire.encode(msg)
        assert msgpack.unpackb(frames[0])["v"] == list(wire.PROTOCOL_VERSION)
        back = wire.decode_reply(frames)
        assert back == msg
    chunk = wire.decode_reply(wire.encode(replies[2]))
    assert bytes(chunk.payload) == body
    assert wire.decode_reply(wire.encode(replies[0])).manifest == m


def test_other_major_version_is_refused_naming_both_versions():
    frame = _pack({"v": [2, 0], "t": "hello", "rid": 7, "prefetch": 0, "chunk": 0})
    with pytest.raises(ProtocolMismatch) as e:
        wire.decode_request([frame])
    assert "2.0" in str(e.value) and "1.1" in str(e.value)
    assert e.value.peer_version == (2, 0) and e.value.rid == 7
    with pytest.raises(ProtocolMismatch):
        wire.decode_reply([_pack({"v": [0, 9], "t": "error", "rid": 1, "code": "x", "msg": "y"})])


def test_newer_minor_version_with_extra_fields_is_accepted():
    frame = _pack({"v": [1, 9], "t": "hello", "rid": 5, "prefetch": 0, "chunk": 0, "future": [1, 2]})
    assert wire.decode_request([frame]) == wire.Hello(rid=5)


@pytest.mark.parametrize("frames, match", [
    ([], "1 frame"),
    ([b"a", b"b", b"c"], "1 frame"),
    ([_pack({"v": [1, 1], "t": "hello", "rid": 1, "prefetch": 0, "chunk": 0}), b"b"], "1 frame"),
    ([_pack({"v": [1, 1], "t": "put", "rid": 1, "sid": 1, "off": 0, "len": 1})], "2 frame"),
    ([b"\xc1"], "malformed msgpack"),
    ([b"\x92\x01"], "malformed msgpack"),  # truncated array
    ([_pack([1, 2])], "must be a map"),
    ([_pack({"t": "hello", "rid": 1})], "'v'"),
    ([_pack({"v": "1.0", "t": "hello", "rid": 1})], "'v'"),
    ([_pack({"v": [1, 0], "rid": 1})], "'t'"),
    ([_pack({"v": [1, 0], "t": "launch", "rid": 1})], "unknown request type"),
    ([_pack({"v": [1, 0], "t": "hello", "prefetch": 0, "chunk": 0})], "missing field 'rid'"),
    ([_pack({"v": [1, 0], "t": "hello", "rid": True, "prefetch": 0, "chunk": 0})], "type bool"),
    ([_pack({"v": [1, 0], "t": "hello", "rid": 1, "prefetch": 10, "chunk": 5})], "prefetch needs chunk"),
    ([_pack({"v": [1, 0], "t": "get", "rid": 1, "sid": 5, "off": -1, "len": 10})], "outside"),
    ([_pack({"v": [1, 0], "t": "get", "rid": 1, "sid": 5, "off": 0, "len": wire.MAX_CHUNK + 1})], "outside"),
    ([_pack({"v": [1, 0], "t": "get", "rid": 1, "sid": 5, "off": 0, "len": "x"})], "type str"),
    ([b"\x00" * (wire.MAX_REQUEST_BYTES + 1)], "exceeds"),
    ([_pack({"v": [1, 1], "t": "hello", "rid": 1, "prefetch": 0, "chunk": 0, "want": 3})], "missing field 'wait_ms'"),
    ([_pack({"v": [1, 1], "t": "hello", "rid": 1, "prefetch": 0, "chunk": 0, "want": 3,
             "wait_ms": wire.MAX_WAIT_MS + 1})], "outside"),
    ([_pack({"v": [1, 1], "t": "hello", "rid": 1, "prefetch": 0, "chunk": 0, "want": -1, "wait_ms": 5})], "outside"),
])
def test_bad_requests_are_rejected_with_a_reason(frames, match):
    with pytest.raises(ProtocolError, match=match):
        wire.decode_request(frames)


def test_bad_replies_are_rejected():
    ok = wire.encode(wire.ChunkReply(rid=1, sid=2, offset=0, length=4, payload=b"abcd"))
    with pytest.raises(ProtocolError, match="header says 4"):
        wire.decode_reply([ok[0], b"abc"])
    with pytest.raises(ProtocolError, match="2 frames"):
        wire.decode_reply(ok[:1])
    with pytest.raises(ProtocolError, match="1 or 2 frames"):
        wire.decode_reply([*ok, b"extra"])
    err = wire.encode(wire.ErrorReply(rid=1, code="busy", message="m"))
    with pytest.raises(ProtocolError, match="is 1 frame"):
        wire.decode_reply([err[0], b"extra"])
    big = _pack({"v": [1, 0], "t": "chunk", "rid": 1, "sid": 1, "off": 0, "len": 1, "pad": "x" * 5000})
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.decode_reply([big, b"a"])
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.decode_reply([b"\x00" * (wire.MAX_MANIFEST_BYTES + 1)])


def _mutated(m: wire.Manifest, path: tuple, value) -> dict:
    d = wire.manifest_to_wire(m)
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msgpack.unpackb(_pack(d))  # as it would arrive


@pytest.mark.parametrize("path, value, match", [
    (("tensors", 1, "offset"), 4000, "packing rule"),  # overlaps the first tensor
    (("tensors", 1, "offset"), 4001 + 64, "packing rule"),  # misaligned / gap
    (("tensors", 0, "nbytes"), 3996, "packing rule"),  # does not match 1000 fp32 values
    (("tensors", 0, "codec"), "zstd", "unknown codec"),
    (("tensors", 0, "dtype"), "float64", "dtype"),
    (("tensors", 0, "shape"), [-1], "bad shape"),
    (("tensors", 0, "shape"), [1] * 9, "bad shape"),
    (("tensors", 1, "name"), "phi", "repeated"),
    (("tensors", 1, "name"), "", "empty"),
    (("total",), 10, "end of last tensor"),
    (("digests",), b"\x00" * 15, "digest bytes"),
    (("block",), 100_000, "power of two"),
    (("block",), 1024, "outside"),
    (("digest",), "md5", "is not"),
    (("sid",), 0, "outside"),
    (("meta",), {"k": [1, 2]}, "meta"),
    (("meta",), {f"k{i}": i for i in range(wire.MAX_META_ITEMS + 1)}, "items"),
    (("tensors",), [{"name": f"t{i}"} for i in range(wire.MAX_TENSORS + 1)], "limit"),
])
def test_manifest_that_breaks_a_rule_is_rejected(path, value, match):
    m = _manifest()
    assert wire.manifest_from_wire(msgpack.unpackb(_pack(wire.manifest_to_wire(m)))) == m
    with pytest.raises(ProtocolError, match=match):
        wire.manifest_from_wire(_mutated(m, path, value))


def test_block_grows_with_the_state_to_bound_the_digest_list():
    assert wire.choose_block(200_000_000) == wire.MIN_CHUNK
    big = wire.MAX_BLOCKS * wire.MIN_CHUNK * 3
    block = wire.choose_block(big)
    assert block == 4 * wire.MIN_CHUNK and -(-big // block) <= wire.MAX_BLOCKS
    with pytest.raises(ProtocolError):
        wire.choose_block(wire.MAX_BLOCKS * wire.MAX_CHUNK + 1)


def test_prefetch_plan_rounds_to_blocks_and_stops_at_the_end():
    block = wire.MIN_CHUNK
    plan = wire.prefetch_plan(total=5 * block + 100, block=block, prefetch=10 * block, chunk=2 * block + 5)
    assert plan == [(0, 2 * block), (2 * block, 2 * block), (4 * block, block + 100)]
    assert wire.prefetch_plan(total=100 * block, block=block, prefetch=3 * block, chunk=block) == \
        [(0, block), (block, block), (2 * block, block)]
    assert wire.prefetch_plan(total=10**9, block=block, prefetch=10**9, chunk=block)[-1][0] == \
        (wire.MAX_INFLIGHT - 1) * block
    assert wire.prefetch_plan(total=10 * block, block=block, prefetch=0, chunk=block) == []


def test_meta_limits():
    assert wire.check_meta({"a": 1, "b": 2.5, "c": "x", "d": True}) == {"a": 1, "b": 2.5, "c": "x", "d": True}
    for bad in ({1: "x"}, {"a": None}, {"a": "x" * (wire.MAX_META_STR + 1)}, {"k" * 65: 1}, [("a", 1)]):
        with pytest.raises(ProtocolError):
            wire.check_meta(bad)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=20),
                  st.binary(max_size=40))
_values = st.recursive(_leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5),
                       max_leaves=20)
_headers = st.fixed_dictionaries(
    {"v": st.sampled_from([[1, 0], [1, 3], [2, 0], [0, 1], "1", None]),
     "t": st.sampled_from(["hello", "get", "manifest", "chunk", "error", "", "x"])},
    optional={"rid": _values | st.integers(-5, 2**64 - 1), "sid": _values | st.integers(-5, 2**64 - 1),
              "off": st.integers(-5, 2**60), "len": st.integers(-5, 2**25), "prefetch": st.integers(-5, 2**45),
              "chunk": st.integers(-5, 2**24), "manifest": _values, "extra": _values})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.one_of(st.binary(max_size=300), _headers.map(_pack), _values.map(_pack)), max_size=3))
def test_any_input_decodes_or_raises_protocol_error(frames):
    for decode in (wire.decode_request, wire.decode_reply):
        try:
            decode(frames)
        except ProtocolError:
            pass


def test_unknown_fields_of_any_shape_are_ignored_in_small_headers():
    big = {"v": [1, 1], "t": "hello", "rid": 9, "prefetch": 0, "chunk": 0,
           "later": list(range(300)), "more": {str(i): i for i in range(100)}, "ext": msgpack.ExtType(5, b"xyz")}
    assert wire.decode_request([msgpack.packb(big, use_bin_type=True)]) == wire.Hello(rid=9)
    bad = {**big, "rid": msgpack.ExtType(1, b"x")}  # in a known field, an ext is still refused
    with pytest.raises(ProtocolError, match="rid"):
        wire.decode_request([msgpack.packb(bad, use_bin_type=True)])
