"""Snapshot manifests: the layout, digests and metadata a fetcher needs before the payload, and
the protocol's size limits.

Split from `wire.py` (which re-exports every name here): the manifest is the one structured
value the protocol carries, checked field by field (`manifest_from_wire`) on both sides of an
exchange, a fetched one and a pushed one alike. `docs/PROTOCOL.md`, section 4, is the specification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

from p2p_diloco.config import WIRE_CODECS
from p2p_diloco.core.codecs import encoded_nbytes
from p2p_diloco.errors import ProtocolError

KiB, MiB = 1024, 1024 * 1024
MAX_REQUEST_BYTES = 4 * KiB  # a request is one small header frame
MAX_REPLY_HEADER_BYTES = 4 * KiB  # header frame of a CHUNK or ERROR reply
MAX_MANIFEST_BYTES = 4 * MiB  # header frame of a MANIFEST reply
MIN_CHUNK, MAX_CHUNK = 64 * KiB, 8 * MiB  # bounds of one CHUNK payload (and of the digest block)
MAX_INFLIGHT = 256  # chunk requests a client may have outstanding on one connection
MAX_BLOCKS = 65536  # digest blocks per snapshot (the block grows with the state to stay under)
MAX_TENSORS, MAX_NAME, MAX_DIMS = 64, 128, 8
MAX_META_ITEMS, MAX_META_KEY, MAX_META_STR, MAX_META_BYTES = 64, 64, 1024, 16 * KiB
MAX_INT = 2**63 - 1
MAX_OFFER_BYTES = 1 * MiB  # a PUSH offer: one frame holding the pusher's manifest
MAX_PUT = 1 * MiB  # payload of one PUT (so pushes need a block of at most this)
FRAME_OVERHEAD = 1024  # socket-level slack over these limits: CurveZMQ adds a box header and a MAC per frame
ALIGN = 64  # every tensor starts at a multiple of this many bytes in the payload
DIGEST, DIGEST_SIZE = "xxh3-128", 16
DTYPE = "float32"  # what every tensor decodes to, whatever codec carried it

ERROR_CODES = ("version", "bad_request", "no_snapshot", "gone", "busy", "refused")
@dataclass(frozen=True)
class TensorSpec:
    """Where one named tensor lies in the snapshot payload and how it is encoded."""

    name: str
    shape: tuple[int, ...]
    codec: str
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Manifest:
    """Everything a fetcher needs before the payload: layout, version, tokens, metadata, digests."""

    sid: int  # random id of this immutable snapshot (versions may repeat after a restart)
    version: int
    tokens: int
    meta: dict[str, Any]
    tensors: tuple[TensorSpec, ...]
    total: int  # payload bytes
    block: int  # digest granularity; chunk offsets and lengths are multiples of it
    digests: bytes  # XXH3-128 of each block, DIGEST_SIZE bytes each, in order

    @property
    def n_blocks(self) -> int:
        return -(-self.total // self.block)

    @property
    def state_bytes(self) -> int:
        """Bytes of the decoded fp32 tensors (what the fetcher must allocate)."""
        return sum(4 * t.numel for t in self.tensors)

    def digest(self, i: int) -> bytes:
        return self.digests[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE]


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def choose_block(total: int) -> int:
    """The smallest power-of-two block >= MIN_CHUNK that keeps the digest list under MAX_BLOCKS."""
    block = MIN_CHUNK
    while -(-total // block) > MAX_BLOCKS:
        block *= 2
        if block > MAX_CHUNK:
            raise ProtocolError(f"a snapshot of {total} bytes exceeds the protocol limit")
    return block


def check_meta(meta: Any) -> dict[str, Any]:
    """Validate snapshot metadata: a small flat map of str -> str/int/float/bool."""
    if not isinstance(meta, dict):
        raise ProtocolError(f"meta must be a map, got {type(meta).__name__}")
    if len(meta) > MAX_META_ITEMS:
        raise ProtocolError(f"meta has {len(meta)} items, limit {MAX_META_ITEMS}")
    for k, v in meta.items():
        if not isinstance(k, str) or not 0 < len(k) <= MAX_META_KEY:
            raise ProtocolError(f"meta key {k!r} must be a str of 1..{MAX_META_KEY} characters")
        ok = isinstance(v, (bool, float)) or (isinstance(v, int) and -MAX_INT - 1 <= v <= MAX_INT)
        ok = ok or (isinstance(v, str) and len(v) <= MAX_META_STR)
        if not ok:
            raise ProtocolError(f"meta[{k!r}] must be a str (<= {MAX_META_STR} chars), int, float or bool")
    if len(msgpack.packb(meta)) > MAX_META_BYTES:
        raise ProtocolError(f"meta is larger than {MAX_META_BYTES} bytes packed")
    return dict(meta)


def manifest_to_wire(m: Manifest) -> dict[str, Any]:
    return {
        "sid": m.sid, "version": m.version, "tokens": m.tokens, "meta": m.meta, "total": m.total,
        "block": m.block, "digest": DIGEST, "digests": m.digests,
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": DTYPE, "codec": t.codec,
                     "offset": t.offset, "nbytes": t.nbytes} for t in m.tensors],
    }


def typed_field(d: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ProtocolError(f"{what}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        raise ProtocolError(f"{what}: field {key!r} has type {type(v).__name__}")
    return v


def int_field(d: Any, key: str, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    v = typed_field(d, key, int, what)
    if not lo <= v <= hi:
        raise ProtocolError(f"{what}: {key}={v} outside [{lo}, {hi}]")
    return v


def manifest_from_wire(d: Any) -> Manifest:
    """Build and check a manifest: packing rule, sizes per codec, digest count, limits."""
    w = "manifest"
    if typed_field(d, "digest", str, w) != DIGEST:
        raise ProtocolError(f"manifest digest {d['digest']!r} is not {DIGEST!r}")
    block = int_field(d, "block", w, MIN_CHUNK, MAX_CHUNK)
    if block & (block - 1):
        raise ProtocolError(f"manifest block {block} is not a power of two")
    raw = typed_field(d, "tensors", list, w)
    if len(raw) > MAX_TENSORS:
        raise ProtocolError(f"manifest lists {len(raw)} tensors, limit {MAX_TENSORS}")
    specs, end, names = [], 0, set()
    for i, t in enumerate(raw):
        tw = f"manifest tensor {i}"
        name = typed_field(t, "name", str, tw)
        if not 0 < len(name) <= MAX_NAME or name in names:
            raise ProtocolError(f"{tw}: name {name[:MAX_NAME]!r} empty, too long or repeated")
        names.add(name)
        shape = typed_field(t, "shape", list, tw)
        if len(shape) > MAX_DIMS or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40 for s in shape):
            raise ProtocolError(f"{tw}: bad shape {shape[:MAX_DIMS]}")
        if typed_field(t, "dtype", str, tw) != DTYPE:
            raise ProtocolError(f"{tw}: dtype must be {DTYPE!r}")
        codec = typed_field(t, "codec", str, tw)
        if codec not in WIRE_CODECS:
            raise ProtocolError(f"{tw}: unknown codec {codec!r}")
        numel = math.prod(shape)
        if numel >= 2**40:
            raise ProtocolError(f"{tw}: {numel} elements is over the limit")
        offset, nbytes = int_field(t, "offset", tw), int_field(t, "nbytes", tw)
        if offset != align_up(end) or nbytes != encoded_nbytes(numel, codec):
            raise ProtocolError(f"{tw}: offset {offset}/nbytes {nbytes} break the packing rule "
                                f"(expected {align_up(end)}/{encoded_nbytes(numel, codec)})")
        specs.append(TensorSpec(name=name, shape=tuple(shape), codec=codec, offset=offset, nbytes=nbytes))
        end = offset + nbytes
    total = int_field(d, "total", w)
    if total != end:
        raise ProtocolError(f"manifest total {total} != end of last tensor {end}")
    if -(-total // block) > MAX_BLOCKS:
        raise ProtocolError(f"manifest has more than {MAX_BLOCKS} blocks")
    digests = typed_field(d, "digests", bytes, w)
    if len(digests) != DIGEST_SIZE * -(-total // block):
        raise ProtocolError(f"manifest has {len(digests)} digest bytes for {-(-total // block)} blocks")
    return Manifest(sid=int_field(d, "sid", w, 1), version=int_field(d, "version", w), tokens=int_field(d, "tokens", w),
                    meta=check_meta(typed_field(d, "meta", dict, w)), tensors=tuple(specs), total=total,
                    block=block, digests=digests)
