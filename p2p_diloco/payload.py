"""Snapshot payloads: named fp32 tensors packed into one immutable, digested byte buffer, and the
receiving side that rebuilds them chunk by chunk.

The publisher pays once (encode, copy, hash every block) so that serving is zero-copy slicing of
one buffer. The receiver checks every block's blake3 digest against the manifest and every value
for finiteness as the bytes arrive, and decodes each chunk straight into the fp32 destination
tensors, so a fetch holds no more than the state itself plus the chunks in flight. Bytes only:
no sockets here (see `transport.py`), no message framing (see `wire.py`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import blake3
import torch

from p2p_diloco import codecs
from p2p_diloco.errors import BadPayload, ProtocolError
from p2p_diloco.wire import DIGEST_SIZE, MAX_NAME, MAX_TENSORS, Manifest, TensorSpec, align_up, check_meta, choose_block

def block_digests(buf: memoryview, block: int) -> bytes:
    """Concatenated blake3 digests of each `block`-byte block of `buf` (the last may be short)."""
    return b"".join(blake3.blake3(buf[i : i + block]).digest()
                    for i in range(0, buf.nbytes, block))


def pack(tensors: Mapping[str, torch.Tensor], codec: str, *, version: int, tokens: int,
         meta: Mapping[str, Any] | None = None) -> tuple[Manifest, torch.Tensor]:
    """Encode `tensors` with `codec` into one new uint8 buffer and describe it in a manifest.

    The buffer is a copy: the caller may keep changing its tensors. Raises `BadPayload` for
    non-finite values and `ProtocolError` for names, types or metadata the protocol cannot carry.
    """
    codecs.check_codec(codec)
    if not isinstance(version, int) or not isinstance(tokens, int) or version < 0 or tokens < 0:
        raise ProtocolError(f"version and tokens must be non-negative ints, got {version!r}, {tokens!r}")
    meta = check_meta(dict(meta or {}))
    if len(tensors) > MAX_TENSORS:
        raise ProtocolError(f"{len(tensors)} tensors, the protocol carries at most {MAX_TENSORS}")
    specs, end = [], 0
    for name, t in tensors.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ProtocolError(f"tensor name {name!r} must be a str of 1..{MAX_NAME} characters")
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise ProtocolError(f"tensor {name!r} must be a float32 torch.Tensor")
        if not codecs.all_finite(t.detach()):
            raise BadPayload(f"refusing to publish tensor {name!r}: it holds NaN or infinite values")
        offset = align_up(end)
        specs.append(TensorSpec(name=name, shape=tuple(t.shape), codec=codec, offset=offset,
                                nbytes=codecs.encoded_nbytes(t.numel(), codec)))
        end = offset + specs[-1].nbytes
    buf = torch.empty(end, dtype=torch.uint8)
    prev_end = 0
    for spec, t in zip(specs, tensors.values()):
        buf[prev_end : spec.offset].zero_()  # alignment padding, covered by the digests
        buf[spec.offset : spec.offset + spec.nbytes].copy_(codecs.encode(t.detach().reshape(-1), codec))
        prev_end = spec.offset + spec.nbytes
    block = choose_block(end)
    manifest = Manifest(sid=secrets.randbits(63) or 1, version=version, tokens=tokens, meta=meta,
                        tensors=tuple(specs), total=end, block=block,
                        digests=block_digests(memoryview(buf.numpy()), block))
    return manifest, buf


class Assembler:
    """Rebuilds a snapshot's fp32 tensors from its chunks, in order, checking as they arrive.

    Memory: the fp32 outputs (one copy of the state) plus, for int8, each tensor's scales
    (1/64 of its fp32 size); chunks are decoded in place and not kept.
    """

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.received = 0
        self._out = {t.name: torch.empty(t.numel, dtype=torch.float32) for t in manifest.tensors}
        self._scales = {t.name: torch.empty(-(-t.numel // codecs.INT8_BLOCK), dtype=torch.float32)
                        for t in manifest.tensors if t.codec == "int8"}
        self._next = 0  # index of the first tensor not yet complete

    @property
    def done(self) -> bool:
        return self.received == self.manifest.total

    def accept(self, offset: int, payload: Any) -> None:
        """Check and decode the chunk `[offset, offset + len(payload))`; raise `BadPayload` if bad."""
        m, data = self.manifest, memoryview(payload)
        n, end = data.nbytes, offset + data.nbytes
        if offset != self.received:
            raise BadPayload(f"chunk at byte {offset} arrived out of order (expected {self.received})")
        if n == 0 or end > m.total or (n % m.block and end != m.total):
            raise BadPayload(f"chunk [{offset}, {end}) does not fit the manifest's blocks")
        first = offset // m.block
        got = b"".join(blake3.blake3(data[p : p + m.block]).digest() for p in range(0, n, m.block))
        if got != m.digests[first * DIGEST_SIZE : first * DIGEST_SIZE + len(got)]:
            bad = next(k for k in range(len(got) // DIGEST_SIZE) if got[k * DIGEST_SIZE : (k + 1) * DIGEST_SIZE]
                       != m.digest(first + k))
            raise BadPayload(f"digest mismatch in block {first + bad} (bytes {offset + bad * m.block}..)")
        src = torch.frombuffer(data, dtype=torch.uint8)
        while self._next < len(m.tensors):
            t = m.tensors[self._next]
            a, b = max(offset, t.offset), min(end, t.offset + t.nbytes)
            if a >= end:
                break
            if a < b:
                self._decode(t, a - t.offset, src[a - offset : b - offset])
            if b < t.offset + t.nbytes:
                break
            self._next += 1
        self.received = end

    def _decode(self, t: TensorSpec, rel: int, seg: torch.Tensor) -> None:
        out = self._out[t.name]
        if t.codec != "int8":
            width = 4 if t.codec == "fp32" else 2
            done = codecs.decode_range_into(out, seg, t.codec, rel // width)
            if not codecs.all_finite(done):
                raise BadPayload(f"tensor {t.name!r} holds NaN or infinite values")
            return
        scales = self._scales[t.name]
        n_scale_bytes = 4 * scales.numel()
        if rel < n_scale_bytes:  # part (or all) of this segment is the scale vector
            k = min(seg.numel(), n_scale_bytes - rel)
            part = scales.view(torch.uint8)[rel : rel + k]
            part.copy_(seg[:k])
            if not codecs.all_finite(part.view(torch.float32)):
                raise BadPayload(f"tensor {t.name!r} has NaN or infinite int8 scales")
            seg, rel = seg[k:], rel + k
        if seg.numel():
            assert rel >= n_scale_bytes, "scales precede codes in order"
            codecs.decode_range_into(out, seg, "int8", rel - n_scale_bytes, scales=scales)

    def result(self) -> dict[str, torch.Tensor]:
        """The decoded tensors in their published shapes; only once every byte has arrived."""
        if not self.done:
            raise BadPayload(f"snapshot incomplete: {self.received} of {self.manifest.total} bytes")
        return {t.name: self._out[t.name].view(t.shape) for t in self.manifest.tensors}

