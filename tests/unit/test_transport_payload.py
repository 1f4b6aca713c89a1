"""Snapshot payloads: packing, chunk-by-chunk reassembly, and every check the receiver makes."""

from __future__ import annotations

import math
import random

import pytest
import torch
import xxhash

from p2p_diloco.core import codecs
from p2p_diloco.errors import BadPayload, CodecError, ProtocolError
from p2p_diloco.exchange import payload, wire
from p2p_diloco.exchange.manifest import manifest_from_wire, manifest_to_wire

CODECS = ["fp32", "bf16", "fp16", "int8", "int4", "sign"]


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"phi": torch.randn(70_001, generator=g), "m": torch.randn(13, 257, generator=g),
            "empty": torch.zeros(0), "one": torch.full((1,), 3.5)}


def _chunks(m: wire.Manifest, rng: random.Random):
    off = 0
    while off < m.total:
        n = min(m.total - off, m.block * rng.randint(1, 3))
        yield off, n
        off += n


@pytest.mark.parametrize("codec", CODECS)
def test_chunked_reassembly_equals_the_codec_round_trip(codec):
    state = _state()
    m, buf = payload.pack(state, codec, version=7, tokens=99, meta={"a": 1})
    assert (m.version, m.tokens, m.meta) == (7, 99, {"a": 1})
    assert m.total == buf.numel() and all(t.offset % wire.ALIGN == 0 for t in m.tensors)
    assert m.state_bytes == 4 * sum(t.numel() for t in state.values())
    asm = payload.Assembler(m)
    view = memoryview(buf.numpy())
    for off, n in _chunks(m, random.Random(1)):
        assert not asm.done
        asm.accept(off, view[off : off + n])
    out = asm.result()
    for name, t in state.items():
        assert out[name].shape == t.shape and out[name].dtype == torch.float32
        expect = codecs.roundtrip(t.reshape(-1), codec).view(t.shape)
        assert torch.equal(out[name], expect), name  # bit for bit what the simulator's codec gives
    kept = payload.Assembler(m, keep_encoded=True)  # what a partner state is held as until it is mixed
    for off, n in _chunks(m, random.Random(2)):
        kept.accept(off, view[off : off + n])
    for name, vec in kept.result().items():
        assert isinstance(vec, codecs.EncodedVector) and torch.equal(vec.float(), out[name].reshape(-1)), name


def test_each_tensor_may_travel_in_its_own_codec():
    """An island's anchor in int8 and its momentum in int4, in one snapshot."""
    state = _state()
    m, buf = payload.pack(state, "int8", version=1, tokens=0, codec_of={"m": "int4"})
    assert {t.name: t.codec for t in m.tensors} == {"phi": "int8", "m": "int4", "empty": "int8", "one": "int8"}
    assert manifest_from_wire(manifest_to_wire(m)) == m and m.total == buf.numel()  # what a fetcher checks
    out = _assemble(m, buf)
    assert torch.equal(out["m"], codecs.roundtrip(state["m"].reshape(-1), "int4").view(13, 257))
    assert torch.equal(out["phi"], codecs.roundtrip(state["phi"], "int8"))
    with pytest.raises(CodecError, match="unknown codec"):
        payload.pack(state, "int8", version=1, tokens=0, codec_of={"m": "int3"})


def test_pack_copies_so_later_changes_do_not_leak():
    t = torch.ones(1000)
    m, buf = payload.pack({"phi": t}, "fp32", version=1, tokens=0)
    t.fill_(5.0)
    assert torch.equal(buf.view(torch.float32), torch.ones(1000))
    assert payload.block_digests(memoryview(buf.numpy()), m.block) == m.digests


@pytest.mark.parametrize("tensors, err", [
    ({"phi": torch.tensor([1.0, float("nan")])}, BadPayload),
    ({"phi": torch.tensor([float("inf")])}, BadPayload),
    ({"phi": torch.ones(3, dtype=torch.float64)}, ProtocolError),
    ({"": torch.ones(3)}, ProtocolError),
    ({f"t{i}": torch.ones(1) for i in range(wire.MAX_TENSORS + 1)}, ProtocolError),
])
def test_pack_refuses_what_cannot_travel(tensors, err):
    with pytest.raises(err):
        payload.pack(tensors, "fp32", version=1, tokens=0)


def _assemble(m, buf, keep_encoded=False):
    asm = payload.Assembler(m, keep_encoded=keep_encoded)
    view = memoryview(buf.numpy())
    for off in range(0, m.total, m.block):
        asm.accept(off, view[off : off + min(m.block, m.total - off)])
    return asm.result()


def test_digest_mismatch_is_caught_and_located():
    m, buf = payload.pack(_state(), "fp32", version=1, tokens=0)
    buf[3 * m.block + 17] ^= 0xFF
    with pytest.raises(BadPayload, match="digest mismatch in block 3"):
        _assemble(m, buf)


@pytest.mark.parametrize("codec, where", [("fp32", 5), ("bf16", 5), ("fp16", 5), ("int8", 0), ("int4", 0), ("sign", 0)])
def test_non_finite_values_with_valid_digests_are_rejected(codec, where):
    """A peer that publishes NaN under correct digests (a diverged island) is still refused."""
    m, buf = payload.pack(_state(), codec, version=1, tokens=0)
    spec = m.tensors[0]
    width = {"fp32": 4, "bf16": 2, "fp16": 2}.get(codec, 4)  # int8, int4, sign: corrupt a scale
    nan = torch.tensor([math.nan]).to({"bf16": torch.bfloat16, "fp16": torch.float16}.get(codec, torch.float32))
    nan = nan.view(torch.uint8)
    start = spec.offset + where * width
    buf[start : start + width] = nan
    forged = wire.Manifest(**{**m.__dict__, "digests": payload.block_digests(memoryview(buf.numpy()), m.block)})
    with pytest.raises(BadPayload, match="NaN or infinite"):
        _assemble(forged, buf)
    with pytest.raises(BadPayload, match="NaN or infinite"):  # kept encoded: refused before it is handed out
        _assemble(forged, buf, keep_encoded=True)


@pytest.mark.parametrize("codec", ["int8", "int4", "sign"])
def test_scales_that_would_overflow_when_decoded_are_refused_kept_encoded(codec):
    m, buf = payload.pack(_state(), codec, version=1, tokens=0)
    spec = m.tensors[0]
    buf[spec.offset : spec.offset + 4] = torch.tensor([3e38]).view(torch.uint8)  # finite, but 127 x 3e38 is not
    forged = wire.Manifest(**{**m.__dict__, "digests": payload.block_digests(memoryview(buf.numpy()), m.block)})
    with pytest.raises(BadPayload, match="overflow when decoded"):
        _assemble(forged, buf, keep_encoded=True)


def test_out_of_order_wrong_size_and_incomplete_chunks_are_rejected():
    m, buf = payload.pack(_state(), "fp32", version=1, tokens=0)
    view = memoryview(buf.numpy())
    asm = payload.Assembler(m)
    with pytest.raises(BadPayload, match="out of order"):
        asm.accept(m.block, view[m.block : 2 * m.block])
    with pytest.raises(BadPayload, match="blocks"):
        asm.accept(0, view[: m.block - 4])
    asm.accept(0, view[: m.block])
    with pytest.raises(BadPayload, match="incomplete"):
        asm.result()


def test_all_finite_and_range_decoding_match_the_codec():
    x = torch.randn(5000) * 100
    assert codecs.all_finite(x) and codecs.all_finite(torch.zeros(0))
    huge = torch.full((4,), 3e38)  # the sum overflows, yet every value is finite
    assert codecs.all_finite(huge)
    assert not codecs.all_finite(torch.tensor([1.0, math.inf])) and not codecs.all_finite(torch.tensor([math.nan]))
    for codec in CODECS:
        enc = codecs.encode(x, codec)
        out = torch.empty(5000)
        if codec in codecs.BLOCK_CODECS:
            nb, per = -(-5000 // codecs.INT8_BLOCK), codecs.PER_BYTE[codec]
            scales, body = enc[: 4 * nb].view(torch.float32), enc[4 * nb :]
            cuts = [(0, 300), (300, 301), (301, 4999), (4999, 5000)] if codec == "int8" else [(0, 304), (304, 5000)]
            for a, b in cuts:
                codecs.decode_range_into(out, body[a // per : -(-b // per)], codec, a, scales=scales)
        else:
            w = 4 if codec == "fp32" else 2
            for a, b in [(0, 300), (300, 4999), (4999, 5000)]:
                codecs.decode_range_into(out, enc[a * w : b * w], codec, a)
        assert torch.equal(out, codecs.decode(enc, 5000, codec)), codec


def test_block_digests_are_xxh3_128_of_each_block():
    data = bytes(range(256)) * 1000
    d = payload.block_digests(memoryview(data), 65536)
    assert len(d) == 16 * 4 and d[16:32] == xxhash.xxh3_128_digest(data[65536:131072])
    assert d[48:] == xxhash.xxh3_128(data[3 * 65536 :]).digest()  # the short last block
