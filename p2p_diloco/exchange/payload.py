"""Snapshot payloads: named fp32 tensors packed into one immutable, digested byte buffer, and the
receiving side that rebuilds them chunk by chunk.

The publisher pays once (encode, copy, hash every block) so that serving is zero-copy slicing of
one buffer. The receiver checks every block's XXH3-128 digest against the manifest and every value
for finiteness as the bytes arrive, and decodes each chunk straight into the fp32 destination
tensors, so a fetch holds no more than the state itself plus the chunks in flight. Bytes only:
no sockets here (see `server.py` and `client.py`), no message framing (see `wire.py`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from p2p_diloco.core import codecs
from p2p_diloco.errors import BadPayload, ProtocolError
from p2p_diloco.exchange.wire import (
    DIGEST_SIZE, MAX_NAME, MAX_TENSORS, Manifest, TensorSpec, align_up, check_meta, choose_block
)


@dataclass(frozen=True)
class Published:
    """A packed snapshot as a server serves it: its manifest, and its bytes to slice chunks from."""

    manifest: Manifest
    view: memoryview  # zero-copy view of the payload buffer, sliced per chunk
    buf: torch.Tensor  # keeps the memory alive

    @classmethod
    def of(cls, manifest: Manifest, buf: torch.Tensor) -> Published:
        return cls(manifest=manifest, view=memoryview(buf.numpy()), buf=buf)


def block_digests(buf: memoryview, block: int) -> bytes:
    """Concatenated XXH3-128 digests of each `block`-byte block of `buf` (the last may be short).

    A fast non-cryptographic hash on purpose: the digests come from the same peer as the bytes, so
    they guard against corruption and mix-ups, not forgery (that is the swarm secret's job).
    """
    return b"".join(xxhash.xxh3_128_digest(buf[i : i + block]) for i in range(0, buf.nbytes, block))


def pack(tensors: Mapping[str, torch.Tensor], codec: str, *, version: int, tokens: int,
         meta: Mapping[str, Any] | None = None,
         codec_of: Mapping[str, str] | None = None) -> tuple[Manifest, torch.Tensor]:
    """Encode `tensors` with `codec` (or `codec_of[name]`, the codec of one tensor: an island's
    momentum travels in int4) into one new uint8 buffer and describe it in a manifest. A tensor
    given as a whole `codecs.EncodedVector` (an update of a public state) is copied as it is encoded.

    The buffer is a copy: the caller may keep changing its tensors. Raises `BadPayload` for
    non-finite values and `ProtocolError` for names, types or metadata the protocol cannot carry.
    """
    encoded = {name for name, t in tensors.items() if isinstance(t, codecs.EncodedVector)}
    codec_of = {name: codecs.check_codec(tensors[name].codec if name in encoded else (codec_of or {}).get(name, codec))
                for name in tensors}
    if not isinstance(version, int) or not isinstance(tokens, int) or version < 0 or tokens < 0:
        raise ProtocolError(f"version and tokens must be non-negative ints, got {version!r}, {tokens!r}")
    meta = check_meta(dict(meta or {}))
    if len(tensors) > MAX_TENSORS:
        raise ProtocolError(f"{len(tensors)} tensors, the protocol carries at most {MAX_TENSORS}")
    for name, t in tensors.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ProtocolError(f"tensor name {name!r} must be a str of 1..{MAX_NAME} characters")
        if name in encoded:
            if t.start or t.length != t.total:
                raise ProtocolError(f"tensor {name!r} is a slice of an encoded vector, not a whole one")
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise ProtocolError(f"tensor {name!r} must be a float32 torch.Tensor")
        if not codecs.all_finite(t.detach()):
            raise BadPayload(f"refusing to publish tensor {name!r}: it holds NaN or infinite values")
    specs, end = layout([(name, (t.total,) if name in encoded else tuple(t.shape), codec_of[name])
                         for name, t in tensors.items()])
    buf = torch.empty(end, dtype=torch.uint8)
    prev_end = 0
    for spec, t in zip(specs, tensors.values()):
        buf[prev_end : spec.offset].zero_()  # alignment padding, covered by the digests
        dst = buf[spec.offset : spec.offset + spec.nbytes]
        if spec.name in encoded:
            dst.copy_(t.buf)
        else:
            codecs.encode_into(dst, t.detach().reshape(-1), spec.codec)
        prev_end = spec.offset + spec.nbytes
    block = choose_block(end)
    manifest = Manifest(sid=secrets.randbits(63) or 1, version=version, tokens=tokens, meta=meta,
                        tensors=tuple(specs), total=end, block=block,
                        digests=block_digests(memoryview(buf.numpy()), block))
    return manifest, buf


def layout(tensors: list[tuple[str, tuple[int, ...], str]]) -> tuple[tuple[TensorSpec, ...], int]:
    """The packing rule for `(name, shape, codec)`: each tensor at the previous end rounded up to
    `ALIGN`; its specs and the payload's total (`exchange.cost` sizes a fetch with it too)."""
    specs, end = [], 0
    for name, shape, codec in tensors:
        offset = align_up(end)
        specs.append(TensorSpec(name=name, shape=shape, codec=codec, offset=offset,
                                nbytes=codecs.encoded_nbytes(math.prod(shape), codec)))
        end = offset + specs[-1].nbytes
    return tuple(specs), end


class Assembler:
    """Rebuilds a snapshot's fp32 tensors from its chunks, in order, checking as they arrive.

    `verify` (digests, and finiteness of fp32 values) touches nothing shared, so a
    fetcher may run it on another thread while `decode` writes the previous or the same chunk;
    `accept` does both in turn. Memory: the fp32 outputs (one copy of the state) plus, for int8,
    each tensor's scales (1/64 of its fp32 size); chunks are decoded in place and not kept.
    """

    def __init__(self, manifest: Manifest, keep_encoded: bool = False) -> None:
        self.manifest = manifest
        self.received = 0
        self.keep_encoded = keep_encoded
        if keep_encoded:  # the payload's own bytes; decoded slice by slice when mixed
            self._raw = torch.frombuffer(mmap.mmap(-1, max(manifest.total, 1)), dtype=torch.uint8)[: manifest.total]
            self._out, self._scales = {}, {}
        else:
            self._out = {t.name: _output(t.numel) for t in manifest.tensors}
            _Prefaulter(list(self._out.values())).start()
            self._scales = {t.name: torch.empty(-(-t.numel // codecs.INT8_BLOCK), dtype=torch.float32)
                            for t in manifest.tensors if t.codec in codecs.BLOCK_CODECS}
        self._next = 0  # index of the first tensor not yet complete

    @property
    def done(self) -> bool:
        return self.received == self.manifest.total

    @property
    def raw(self) -> torch.Tensor:
        """The payload's bytes as they arrived (`keep_encoded` only): what a relay serves on."""
        assert self.keep_encoded, "the bytes are kept only with keep_encoded"
        return self._raw

    def accept(self, offset: int, payload: Any) -> None:
        """Check and decode the chunk `[offset, offset + len(payload))`; raise `BadPayload` if bad."""
        self.verify(offset, payload)
        self.decode(offset, payload)

    def _segments(self, offset: int, end: int, start: int = 0):
        """(tensor index, spec, byte range [a, b)) of each tensor the range [offset, end) covers."""
        tensors = self.manifest.tensors
        for i in range(start, len(tensors)):
            t = tensors[i]
            a, b = max(offset, t.offset), min(end, t.offset + t.nbytes)
            if a >= end:
                return
            yield i, t, a, b

    def verify(self, offset: int, payload: Any) -> None:
        """Digest every block of the chunk and check that its fp32 values are finite."""
        m, data = self.manifest, memoryview(payload)
        n, end = data.nbytes, offset + data.nbytes
        if n == 0 or offset % m.block or end > m.total or (n % m.block and end != m.total):
            raise BadPayload(f"chunk [{offset}, {end}) does not fit the manifest's blocks")
        first = offset // m.block
        got = block_digests(data, m.block)
        if got != m.digests[first * DIGEST_SIZE : first * DIGEST_SIZE + len(got)]:
            bad = next(k for k in range(len(got) // DIGEST_SIZE)
                       if got[k * DIGEST_SIZE : (k + 1) * DIGEST_SIZE] != m.digest(first + k))
            raise BadPayload(f"digest mismatch in block {first + bad} (bytes {offset + bad * m.block}..)")
        src = torch.frombuffer(data, dtype=torch.uint8) if n else None
        for _, t, a, b in self._segments(offset, end):
            # fp32 is checked here as it travels; the others once decoded (a 16-bit sum is slow, and
            # int8's code x scale can overflow)
            if a < b and t.codec == "fp32" and not codecs.all_finite(src[a - offset : b - offset].view(torch.float32)):
                raise BadPayload(f"tensor {t.name!r} holds NaN or infinite values")

    def decode(self, offset: int, payload: Any) -> None:
        """Write a verified chunk into the outputs; chunks must come in order."""
        data = memoryview(payload)
        end = offset + data.nbytes
        if offset != self.received:
            raise BadPayload(f"chunk at byte {offset} arrived out of order (expected {self.received})")
        src = torch.frombuffer(data, dtype=torch.uint8)
        if self.keep_encoded:
            self._raw[offset:end].copy_(src)
            self.received = end
            return
        for i, t, a, b in self._segments(offset, end, self._next):
            if a < b:
                self._decode(t, a - t.offset, src[a - offset : b - offset])
            if b < t.offset + t.nbytes:
                break
            self._next = i + 1
        self.received = end

    def _decode(self, t: TensorSpec, rel: int, seg: torch.Tensor) -> None:
        out = self._out[t.name]
        if t.codec not in codecs.BLOCK_CODECS:
            done = codecs.decode_range_into(out, seg, t.codec, rel // (4 if t.codec == "fp32" else 2))
            if t.codec != "fp32" and not codecs.all_finite(done):
                raise BadPayload(f"tensor {t.name!r} holds NaN or infinite values")
            return
        scales = self._scales[t.name]
        n_scale_bytes = 4 * scales.numel()
        if rel < n_scale_bytes:  # part (or all) of this segment is the scale vector
            k = min(seg.numel(), n_scale_bytes - rel)
            scales.view(torch.uint8)[rel : rel + k].copy_(seg[:k])
            seg, rel = seg[k:], rel + k
        if seg.numel():
            assert rel >= n_scale_bytes, "scales precede codes in order"
            done = codecs.decode_range_into(out, seg, t.codec, (rel - n_scale_bytes) * codecs.PER_BYTE[t.codec],
                                            scales=scales)
            if not codecs.all_finite(done):
                raise BadPayload(f"tensor {t.name!r} has NaN or infinite {t.codec} values (bad scales)")

    def result(self) -> dict[str, torch.Tensor | codecs.EncodedVector]:
        """The tensors in their published shapes (flat `EncodedVector`s with `keep_encoded`); only once
        every byte has arrived, and, kept encoded, once every value is known to decode finite."""
        if not self.done:
            raise BadPayload(f"snapshot incomplete: {self.received} of {self.manifest.total} bytes")
        if not self.keep_encoded:
            return {t.name: self._out[t.name].view(t.shape) for t in self.manifest.tensors}
        out = {}
        for t in self.manifest.tensors:
            vec = codecs.EncodedVector(self._raw[t.offset : t.offset + t.nbytes], t.codec, t.numel)
            self._check_encoded(t, vec)
            out[t.name] = vec
        return out

    def _check_encoded(self, t: TensorSpec, vec: codecs.EncodedVector) -> None:
        """Finite values without decoding the whole tensor: the block codecs' codes are bounded, so finite
        scales small enough that no code times its scale overflows suffice; 16-bit values are decoded a
        slice at a time (fp32 was checked as it arrived)."""
        if t.codec in codecs.BLOCK_CODECS:
            scales = vec.buf[: 4 * -(-t.numel // codecs.INT8_BLOCK)].view(torch.float32)
            if not (codecs.all_finite(scales) and bool((scales.abs() <= _MAX_INT8_SCALE).all())):
                raise BadPayload(f"tensor {t.name!r} has NaN or infinite {t.codec} scales (or scales that overflow "
                                 "when decoded)")
        elif t.codec != "fp32":
            for i in range(0, t.numel, _CHECK_SLICE):
                if not codecs.all_finite(vec[i : i + _CHECK_SLICE].float()):
                    raise BadPayload(f"tensor {t.name!r} holds NaN or infinite values")


_MAX_INT8_SCALE = torch.finfo(torch.float32).max / 128
"""The largest scale of a block codec whose every code (-128..127) decodes to a finite fp32 value."""
_CHECK_SLICE = 1 << 22
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault pages in, writable, without touching their contents
_PREFAULT_STEP = 8 * 1024 * 1024
log = logging.getLogger(__name__)


def _output(numel: int) -> torch.Tensor:
    """A fresh fp32 buffer in its own anonymous mapping (page-aligned, so it can be prefaulted)."""
    if numel * 4 < _PREFAULT_STEP:
        return torch.empty(numel, dtype=torch.float32)
    return torch.frombuffer(mmap.mmap(-1, numel * 4), dtype=torch.float32)


class _Prefaulter(threading.Thread):
    """Faults the output buffers in on another core, ahead of the chunks being copied into them.

    A fresh buffer costs a page fault per 4 KiB on first write, as much CPU as the copy itself; with
    the pages made present here (MADV_POPULATE_WRITE, which writes nothing, so racing the decoder
    is harmless) the decoding thread only copies. Where the kernel lacks it, nothing happens.
    """

    _madvise = None
    _supported = True

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__(name="fetch-prefault", daemon=True)
        self._outputs = [t for t in outputs if t.numel() * 4 >= _PREFAULT_STEP]  # keeps them mapped meanwhile

    def start(self) -> None:
        if self._outputs and _Prefaulter._supported:
            super().start()

    def run(self) -> None:
        if _Prefaulter._madvise is None:
            libc = ctypes.CDLL(None, use_errno=True)  # a foreign call releases the GIL
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _Prefaulter._madvise = libc.madvise
        for t in self._outputs:
            addr, size = t.data_ptr(), t.numel() * 4
            for off in range(0, size, _PREFAULT_STEP):
                if _Prefaulter._madvise(addr + off, min(_PREFAULT_STEP, size - off), _MADV_POPULATE_WRITE):
                    _Prefaulter._supported = False
                    log.debug("prefaulting unavailable (errno %d)", ctypes.get_errno())
                    return
