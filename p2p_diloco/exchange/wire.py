"""The wire protocol of the state exchange: messages and bytes, nothing about sockets.

A message is a list of frames `[header, *payload]`. The header is a msgpack map that carries the
protocol version `v = [major, minor]` and a type `t`; a payload frame is raw bytes, never pickled.
`encode()` turns a message dataclass into frames; `decode_request()` and `decode_reply()` turn
frames back, bounding every frame's size *before* parsing and checking every field after, and
raise `ProtocolError` (`ProtocolMismatch` for another major version) on anything else.
`docs/PROTOCOL.md` is the specification; this module is its reference implementation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from p2p_diloco.core.codecs import CODECS, encoded_nbytes
from p2p_diloco.errors import ProtocolError, ProtocolMismatch

PROTOCOL_VERSION = (1, 0)
"""(major, minor): a different major is refused; a newer minor may add optional fields."""

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
FRAME_OVERHEAD = 1024  # socket-level slack over these limits: CurveZMQ adds a box header and a MAC per frame
ALIGN = 64  # every tensor starts at a multiple of this many bytes in the payload
DIGEST, DIGEST_SIZE = "xxh3-128", 16
DTYPE = "float32"  # what every tensor decodes to, whatever codec carried it

ERROR_CODES = ("version", "bad_request", "no_snapshot", "gone", "busy")


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


@dataclass(frozen=True)
class Hello:
    """Client -> server, opens every exchange: asks for the manifest (and optionally a prefetch)."""

    rid: int
    prefetch: int = 0  # payload bytes the server should start sending right after the manifest
    chunk: int = 0  # chunk length for the prefetch (a multiple of the block, >= MIN_CHUNK)


@dataclass(frozen=True)
class GetChunk:
    """Client -> server: one byte range `[offset, offset + length)` of snapshot `sid`."""

    rid: int
    sid: int
    offset: int
    length: int


@dataclass(frozen=True)
class ManifestReply:
    rid: int
    manifest: Manifest


@dataclass(frozen=True)
class ChunkReply:
    rid: int
    sid: int
    offset: int
    length: int
    payload: Any = field(default=b"", repr=False, compare=False)  # any buffer of `length` bytes


@dataclass(frozen=True)
class ErrorReply:
    rid: int
    code: str
    message: str
    version: int | None = None  # the server's current snapshot version, when it has one


Request = Hello | GetChunk
Reply = ManifestReply | ChunkReply | ErrorReply


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


def prefetch_plan(total: int, block: int, prefetch: int, chunk: int) -> list[tuple[int, int]]:
    """The chunks `(offset, length)` a server sends unasked after the manifest of a HELLO.

    Both sides compute the same list: chunk length `c = max(block, chunk rounded down to the
    block)`, offsets 0, c, 2c, ... below `min(prefetch, total)`, at most MAX_INFLIGHT chunks.
    """
    if prefetch <= 0 or chunk <= 0:
        return []
    c = min(MAX_CHUNK, max(block, chunk - chunk % block))
    stop = min(prefetch, total)
    return [(off, min(c, total - off)) for off in range(0, stop, c)][:MAX_INFLIGHT]


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


def _get(d: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ProtocolError(f"{what}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        raise ProtocolError(f"{what}: field {key!r} has type {type(v).__name__}")
    return v


def _int(d: Any, key: str, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    v = _get(d, key, int, what)
    if not lo <= v <= hi:
        raise ProtocolError(f"{what}: {key}={v} outside [{lo}, {hi}]")
    return v


def manifest_from_wire(d: Any) -> Manifest:
    """Build and check a manifest: packing rule, sizes per codec, digest count, limits."""
    w = "manifest"
    if _get(d, "digest", str, w) != DIGEST:
        raise ProtocolError(f"manifest digest {d['digest']!r} is not {DIGEST!r}")
    block = _int(d, "block", w, MIN_CHUNK, MAX_CHUNK)
    if block & (block - 1):
        raise ProtocolError(f"manifest block {block} is not a power of two")
    raw = _get(d, "tensors", list, w)
    if len(raw) > MAX_TENSORS:
        raise ProtocolError(f"manifest lists {len(raw)} tensors, limit {MAX_TENSORS}")
    specs, end, names = [], 0, set()
    for i, t in enumerate(raw):
        tw = f"manifest tensor {i}"
        name = _get(t, "name", str, tw)
        if not 0 < len(name) <= MAX_NAME or name in names:
            raise ProtocolError(f"{tw}: name {name[:MAX_NAME]!r} empty, too long or repeated")
        names.add(name)
        shape = _get(t, "shape", list, tw)
        if len(shape) > MAX_DIMS or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40 for s in shape):
            raise ProtocolError(f"{tw}: bad shape {shape[:MAX_DIMS]}")
        if _get(t, "dtype", str, tw) != DTYPE:
            raise ProtocolError(f"{tw}: dtype must be {DTYPE!r}")
        codec = _get(t, "codec", str, tw)
        if codec not in CODECS:
            raise ProtocolError(f"{tw}: unknown codec {codec!r}")
        numel = math.prod(shape)
        if numel >= 2**40:
            raise ProtocolError(f"{tw}: {numel} elements is over the limit")
        offset, nbytes = _int(t, "offset", tw), _int(t, "nbytes", tw)
        if offset != align_up(end) or nbytes != encoded_nbytes(numel, codec):
            raise ProtocolError(f"{tw}: offset {offset}/nbytes {nbytes} break the packing rule "
                                f"(expected {align_up(end)}/{encoded_nbytes(numel, codec)})")
        specs.append(TensorSpec(name=name, shape=tuple(shape), codec=codec, offset=offset, nbytes=nbytes))
        end = offset + nbytes
    total = _int(d, "total", w)
    if total != end:
        raise ProtocolError(f"manifest total {total} != end of last tensor {end}")
    if -(-total // block) > MAX_BLOCKS:
        raise ProtocolError(f"manifest has more than {MAX_BLOCKS} blocks")
    digests = _get(d, "digests", bytes, w)
    if len(digests) != DIGEST_SIZE * -(-total // block):
        raise ProtocolError(f"manifest has {len(digests)} digest bytes for {-(-total // block)} blocks")
    return Manifest(sid=_int(d, "sid", w, 1), version=_int(d, "version", w), tokens=_int(d, "tokens", w),
                    meta=check_meta(_get(d, "meta", dict, w)), tensors=tuple(specs), total=total,
                    block=block, digests=digests)


def _header(t: str, **fields: Any) -> bytes:
    return msgpack.packb({"v": list(PROTOCOL_VERSION), "t": t, **fields}, use_bin_type=True)


def encode(msg: Request | Reply) -> list[Any]:
    """Frames for one message: `[header]` or `[header, payload]` (payload left as given, zero-copy)."""
    if isinstance(msg, Hello):
        return [_header("hello", rid=msg.rid, prefetch=msg.prefetch, chunk=msg.chunk)]
    if isinstance(msg, GetChunk):
        return [_header("get", rid=msg.rid, sid=msg.sid, off=msg.offset, len=msg.length)]
    if isinstance(msg, ManifestReply):
        return [_header("manifest", rid=msg.rid, manifest=manifest_to_wire(msg.manifest))]
    if isinstance(msg, ChunkReply):
        return [_header("chunk", rid=msg.rid, sid=msg.sid, off=msg.offset, len=msg.length), msg.payload]
    if isinstance(msg, ErrorReply):
        return [_header("error", rid=msg.rid, code=msg.code, msg=msg.message, version=msg.version)]
    raise TypeError(f"not a wire message: {type(msg).__name__}")


def _unpack(frame: Any, limit: int) -> dict[str, Any]:
    """Size-check, then parse one header frame and check its protocol version."""
    view = memoryview(frame)
    if view.nbytes > limit:
        raise ProtocolError(f"header of {view.nbytes} bytes exceeds the {limit}-byte limit")
    try:
        d = msgpack.unpackb(view, raw=False, strict_map_key=True, max_str_len=limit, max_bin_len=limit, max_array_len=max(MAX_TENSORS, 16),
                            max_map_len=max(MAX_META_ITEMS, 16), max_ext_len=0)
    except Exception as e:  # msgpack raises many types (ValueError, ExtraData, StackError, ...)
        raise ProtocolError(f"malformed msgpack header: {type(e).__name__}: {e}") from e
    if not isinstance(d, dict):
        raise ProtocolError(f"header must be a map, got {type(d).__name__}")
    v = d.get("v")
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise ProtocolError(f"header field 'v' must be [major, minor], got {v!r:.40}")
    if v[0] != PROTOCOL_VERSION[0]:
        e = ProtocolMismatch(f"peer speaks protocol {v[0]}.{v[1]}, this side speaks "
                             f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}")
        e.peer_version = (v[0], v[1])
        rid = d.get("rid")
        e.rid = rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= MAX_INT else 0
        raise e
    if not isinstance(d.get("t"), str):
        raise ProtocolError("header field 't' (message type) missing")
    return d


def decode_request(frames: Sequence[Any]) -> Request:
    """Parse what a client sent (identity frame already removed)."""
    if len(frames) != 1:
        raise ProtocolError(f"a request is exactly 1 frame, got {len(frames)}")
    d = _unpack(frames[0], MAX_REQUEST_BYTES)
    t, rid = d["t"], _int(d, "rid", "request", 0, MAX_INT)
    if t == "hello":
        prefetch, chunk = _int(d, "prefetch", "hello", 0, 2**40), _int(d, "chunk", "hello", 0, MAX_CHUNK)
        if prefetch and chunk < MIN_CHUNK:
            raise ProtocolError(f"hello: prefetch needs chunk >= {MIN_CHUNK}, got {chunk}")
        return Hello(rid=rid, prefetch=prefetch, chunk=chunk)
    if t == "get":
        return GetChunk(rid=rid, sid=_int(d, "sid", "get", 1), offset=_int(d, "off", "get", 0, 2**50),
                        length=_int(d, "len", "get", 1, MAX_CHUNK))
    raise ProtocolError(f"unknown request type {t[:32]!r}")


def decode_reply(frames: Sequence[Any]) -> Reply:
    """Parse what a server sent; a CHUNK's payload stays a zero-copy memoryview of its frame."""
    if not 1 <= len(frames) <= 2:
        raise ProtocolError(f"a reply is 1 or 2 frames, got {len(frames)}")
    first = memoryview(frames[0])
    limit = MAX_MANIFEST_BYTES if first.nbytes > MAX_REPLY_HEADER_BYTES else MAX_REPLY_HEADER_BYTES
    d = _unpack(first, limit)
    t, rid = d["t"], _int(d, "rid", "reply", 0, MAX_INT)
    if t != "chunk" and len(frames) != 1:
        raise ProtocolError(f"a {t[:32]!r} reply is 1 frame, got {len(frames)}")
    if t == "manifest":
        return ManifestReply(rid=rid, manifest=manifest_from_wire(d.get("manifest")))
    if first.nbytes > MAX_REPLY_HEADER_BYTES:
        raise ProtocolError(f"{t[:32]!r} header of {first.nbytes} bytes exceeds {MAX_REPLY_HEADER_BYTES}")
    if t == "chunk":
        if len(frames) != 2:
            raise ProtocolError("a chunk reply is 2 frames (header, payload)")
        length, payload = _int(d, "len", "chunk", 1, MAX_CHUNK), memoryview(frames[1])
        if payload.nbytes != length:
            raise ProtocolError(f"chunk payload is {payload.nbytes} bytes, header says {length}")
        return ChunkReply(rid=rid, sid=_int(d, "sid", "chunk", 1), offset=_int(d, "off", "chunk", 0, 2**50),
                          length=length, payload=payload)
    if t == "error":
        code, message = _get(d, "code", str, "error"), _get(d, "msg", str, "error")
        version = d.get("version")
        if version is not None and not (isinstance(version, int) and not isinstance(version, bool)):
            raise ProtocolError("error: field 'version' must be an int or nil")
        return ErrorReply(rid=rid, code=code[:64], message=message[:1024], version=version)
    raise ProtocolError(f"unknown reply type {t[:32]!r}")
