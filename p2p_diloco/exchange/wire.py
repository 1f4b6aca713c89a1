"""The wire protocol of the state exchange: messages and bytes, nothing about sockets.

A message is a list of frames `[header, *payload]`. The header is a msgpack map that carries the
protocol version `v = [major, minor]` and a type `t`; a payload frame is raw bytes, never pickled.
`encode()` turns a message dataclass into frames; `decode_request()` and `decode_reply()` turn
frames back, bounding every frame's size *before* parsing and checking every field after, and
raise `ProtocolError` (`ProtocolMismatch` for another major version) on anything else.
`docs/PROTOCOL.md` is the specification; this module is its reference implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from p2p_diloco.errors import ProtocolError, ProtocolMismatch
from p2p_diloco.exchange.manifest import (  # noqa: F401  (re-exported: the protocol's names live in `wire`)
    ALIGN, DIGEST, DIGEST_SIZE, DTYPE, ERROR_CODES, FRAME_OVERHEAD, MAX_BLOCKS, MAX_CHUNK, MAX_DIMS, MAX_INFLIGHT,
    MAX_INT, MAX_MANIFEST_BYTES, MAX_META_BYTES, MAX_META_ITEMS, MAX_META_KEY, MAX_META_STR, MAX_NAME,
    MAX_OFFER_BYTES, MAX_PUT, MAX_REPLY_HEADER_BYTES, MAX_REQUEST_BYTES, MAX_TENSORS, MIN_CHUNK, KiB, Manifest,
    MiB, TensorSpec, align_up, check_meta, choose_block, int_field, manifest_from_wire, manifest_to_wire, typed_field
)

MAX_WAIT_MS = 60_000
"""The longest a `hello.want` may ask the server to hold its answer (1.1)."""

PROTOCOL_VERSION = (1, 1)
"""(major, minor): a different major is refused; a newer minor may add optional fields and messages
(1.1: `push`/`put` from a client that cannot be dialled, answered by `grant`/`stored`; `hello.peer`
for a relay)."""


@dataclass(frozen=True)
class Hello:
    """Client -> server, opens every exchange: asks for the manifest (and optionally a prefetch)."""

    rid: int
    prefetch: int = 0  # payload bytes the server should start sending right after the manifest
    chunk: int = 0  # chunk length for the prefetch (a multiple of the block, >= MIN_CHUNK)
    peer: str | None = None  # 1.1, relays only: whose relayed state (a peer id); None: the server's own
    pub: bool = False  # 1.1: the public state's updates instead of the state (`core.public`)
    chain: str | None = None  # 1.1, with `pub`: the chain of the public state the client holds ...
    since: int | None = None  # ... and its version there: send the updates since then
    want: int | None = None  # 1.1: answer once the server has published this version ...
    wait_ms: int = 0  # ... or after this many ms (at most MAX_WAIT_MS), whichever comes first


@dataclass(frozen=True)
class GetChunk:
    """Client -> server: one byte range `[offset, offset + length)` of snapshot `sid`."""

    rid: int
    sid: int
    offset: int
    length: int


@dataclass(frozen=True)
class PushOffer:
    """Client -> server (1.1): "take my state": a client nobody can dial offers its snapshot over the
    connection it opened; the server answers GRANTs (or an ERROR) and pulls nothing itself."""

    rid: int
    manifest: Manifest


@dataclass(frozen=True)
class PushPut:
    """Client -> server (1.1): bytes `[offset, offset + length)` of the offered snapshot, within a grant."""

    rid: int
    sid: int
    offset: int
    length: int
    payload: Any = field(default=b"", repr=False, compare=False)


@dataclass(frozen=True)
class ManifestReply:
    rid: int
    manifest: Manifest


@dataclass(frozen=True)
class Waiting:
    """Server -> client (1.1), at once for a HELLO with `want` that it holds: "alive, and waiting
    until I publish that version"; the manifest follows then, or when `wait_ms` is over."""

    rid: int
    version: int  # the version the server has published now (-1: none yet)


@dataclass(frozen=True)
class ChunkReply:
    rid: int
    sid: int
    offset: int
    length: int
    payload: Any = field(default=b"", repr=False, compare=False)  # any buffer of `length` bytes


@dataclass(frozen=True)
class PushGrant:
    """Server -> client (1.1): the pusher may send its payload up to byte `upto` (flow control)."""

    rid: int
    sid: int
    upto: int


@dataclass(frozen=True)
class PushStored:
    """Server -> client (1.1): the pushed snapshot arrived whole and passed every check."""

    rid: int
    sid: int


@dataclass(frozen=True)
class ErrorReply:
    rid: int
    code: str
    message: str
    version: int | None = None  # the server's current snapshot version, when it has one


Request = Hello | GetChunk | PushOffer | PushPut
Reply = ManifestReply | Waiting | ChunkReply | PushGrant | PushStored | ErrorReply


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


def frame_size(n: int) -> int:
    """Bytes of an `n`-byte frame on a ZeroMQ connection: ZMTP's frame header (2 bytes up to 255, else 9) first."""
    return n + (2 if n <= 255 else 9)


def frames_size(frames: Sequence[Any]) -> int:
    """Bytes of one message's frames on the wire (what `Fetcher.wire_bytes` and `exchange.cost` count)."""
    return sum(frame_size(memoryview(f).nbytes) for f in frames)


def _header(t: str, **fields: Any) -> bytes:
    return msgpack.packb({"v": list(PROTOCOL_VERSION), "t": t, **fields}, use_bin_type=True)


def encode(msg: Request | Reply) -> list[Any]:
    """Frames for one message: `[header]` or `[header, payload]` (payload left as given, zero-copy)."""
    if isinstance(msg, Hello):
        extra = {} if msg.peer is None else {"peer": msg.peer}
        if msg.pub:
            extra["pub"] = True
            if msg.chain is not None:
                extra.update(chain=msg.chain, since=msg.since)
        if msg.want is not None:
            extra.update(want=msg.want, wait_ms=msg.wait_ms)
        return [_header("hello", rid=msg.rid, prefetch=msg.prefetch, chunk=msg.chunk, **extra)]
    if isinstance(msg, GetChunk):
        return [_header("get", rid=msg.rid, sid=msg.sid, off=msg.offset, len=msg.length)]
    if isinstance(msg, PushOffer):
        return [_header("push", rid=msg.rid, manifest=manifest_to_wire(msg.manifest))]
    if isinstance(msg, PushPut):
        return [_header("put", rid=msg.rid, sid=msg.sid, off=msg.offset, len=msg.length), msg.payload]
    if isinstance(msg, PushGrant):
        return [_header("grant", rid=msg.rid, sid=msg.sid, upto=msg.upto)]
    if isinstance(msg, PushStored):
        return [_header("stored", rid=msg.rid, sid=msg.sid)]
    if isinstance(msg, ManifestReply):
        return [_header("manifest", rid=msg.rid, manifest=manifest_to_wire(msg.manifest))]
    if isinstance(msg, Waiting):
        return [_header("wait", rid=msg.rid, version=msg.version)]
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
    # A small header cannot hold more entries than bytes, so any array, map or ext type an unknown
    # (later 1.x) field brings is parsed and ignored; a large one (a manifest) keeps tight limits
    small = limit <= MAX_REPLY_HEADER_BYTES
    try:
        d = msgpack.unpackb(view, raw=False, strict_map_key=True, max_str_len=limit, max_bin_len=limit,
                            max_array_len=limit if small else max(MAX_TENSORS, 16),
                            max_map_len=limit if small else max(MAX_META_ITEMS, 16), max_ext_len=limit if small else 0)
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
    """Parse what a client sent (identity frame already removed).

    A `ProtocolError` carries the request's `rid` as `.rid` whenever it could be read (else 0), so
    the error reply can echo it.
    """
    if not 1 <= len(frames) <= 2:
        raise ProtocolError(f"a request is 1 frame (2 for a put), got {len(frames)}")
    size = memoryview(frames[0]).nbytes
    if size <= MAX_REQUEST_BYTES:
        d = _unpack(frames[0], MAX_REQUEST_BYTES)
    else:  # only a push offer (it holds a manifest) may be larger
        try:
            d = _unpack(frames[0], MAX_OFFER_BYTES)
        except ProtocolMismatch:
            raise
        except ProtocolError:
            d = None
        if d is None or d["t"] != "push":
            raise ProtocolError(f"a request of {size} bytes exceeds the {MAX_REQUEST_BYTES}-byte limit (only a "
                                f"push offer may be larger, up to {MAX_OFFER_BYTES})")
    t, rid = d["t"], int_field(d, "rid", "request", 0, MAX_INT)
    try:
        if (t == "put") != (len(frames) == 2):
            raise ProtocolError(f"a {t[:32]!r} request is {2 if t == 'put' else 1} frame(s), got {len(frames)}")
        return _request(t, rid, d, frames)
    except ProtocolError as e:
        e.rid = rid
        raise


def _request(t: str, rid: int, d: dict[str, Any], frames: Sequence[Any]) -> Request:
    if t == "hello":
        prefetch, chunk = int_field(d, "prefetch", "hello", 0, 2**40), int_field(d, "chunk", "hello", 0, MAX_CHUNK)
        if prefetch and chunk < MIN_CHUNK:
            raise ProtocolError(f"hello: prefetch needs chunk >= {MIN_CHUNK}, got {chunk}")
        peer = d.get("peer")
        if peer is not None and not (isinstance(peer, str) and 0 < len(peer) <= MAX_META_KEY):
            raise ProtocolError(f"hello: peer must be a str of 1..{MAX_META_KEY} characters or absent")
        pub, chain = d.get("pub", False), d.get("chain")
        if not isinstance(pub, bool):
            raise ProtocolError("hello: pub must be a bool or absent")
        if chain is not None and not (pub and isinstance(chain, str) and 0 < len(chain) <= MAX_META_KEY):
            raise ProtocolError(f"hello: chain must be a str of 1..{MAX_META_KEY} characters, with pub, or absent")
        since = None if chain is None else int_field(d, "since", "hello", 0, MAX_INT)
        want = None if d.get("want") is None else int_field(d, "want", "hello", 0, MAX_INT)
        wait_ms = 0 if want is None else int_field(d, "wait_ms", "hello", 0, MAX_WAIT_MS)
        return Hello(rid=rid, prefetch=prefetch, chunk=chunk, peer=peer, pub=pub, chain=chain, since=since,
                     want=want, wait_ms=wait_ms)
    if t == "get":
        return GetChunk(rid=rid, sid=int_field(d, "sid", "get", 1), offset=int_field(d, "off", "get", 0, 2**50),
                        length=int_field(d, "len", "get", 1, MAX_CHUNK))
    if t == "push":
        return PushOffer(rid=rid, manifest=manifest_from_wire(d.get("manifest")))
    if t == "put":
        length, payload = int_field(d, "len", "put", 1, MAX_PUT), memoryview(frames[1])
        if payload.nbytes != length:
            raise ProtocolError(f"put payload is {payload.nbytes} bytes, header says {length}")
        return PushPut(rid=rid, sid=int_field(d, "sid", "put", 1), offset=int_field(d, "off", "put", 0, 2**50), length=length,
                       payload=payload)
    raise ProtocolError(f"unknown request type {t[:32]!r}")


def decode_reply(frames: Sequence[Any]) -> Reply:
    """Parse what a server sent; a CHUNK's payload stays a zero-copy memoryview of its frame."""
    if not 1 <= len(frames) <= 2:
        raise ProtocolError(f"a reply is 1 or 2 frames, got {len(frames)}")
    first = memoryview(frames[0])
    limit = MAX_MANIFEST_BYTES if first.nbytes > MAX_REPLY_HEADER_BYTES else MAX_REPLY_HEADER_BYTES
    d = _unpack(first, limit)
    t, rid = d["t"], int_field(d, "rid", "reply", 0, MAX_INT)
    if t != "chunk" and len(frames) != 1:
        raise ProtocolError(f"a {t[:32]!r} reply is 1 frame, got {len(frames)}")
    if t == "manifest":
        return ManifestReply(rid=rid, manifest=manifest_from_wire(d.get("manifest")))
    if first.nbytes > MAX_REPLY_HEADER_BYTES:
        raise ProtocolError(f"{t[:32]!r} header of {first.nbytes} bytes exceeds {MAX_REPLY_HEADER_BYTES}")
    if t == "chunk":
        if len(frames) != 2:
            raise ProtocolError("a chunk reply is 2 frames (header, payload)")
        length, payload = int_field(d, "len", "chunk", 1, MAX_CHUNK), memoryview(frames[1])
        if payload.nbytes != length:
            raise ProtocolError(f"chunk payload is {payload.nbytes} bytes, header says {length}")
        return ChunkReply(rid=rid, sid=int_field(d, "sid", "chunk", 1), offset=int_field(d, "off", "chunk", 0, 2**50),
                          length=length, payload=payload)
    if t == "wait":
        return Waiting(rid=rid, version=int_field(d, "version", "wait", -1, MAX_INT))
    if t == "grant":
        return PushGrant(rid=rid, sid=int_field(d, "sid", "grant", 1), upto=int_field(d, "upto", "grant", 0, 2**50))
    if t == "stored":
        return PushStored(rid=rid, sid=int_field(d, "sid", "stored", 1))
    if t == "error":
        code, message = typed_field(d, "code", str, "error"), typed_field(d, "msg", str, "error")
        version = d.get("version")
        if version is not None and not (isinstance(version, int) and not isinstance(version, bool)):
            raise ProtocolError("error: field 'version' must be an int or nil")
        return ErrorReply(rid=rid, code=code[:64], message=message[:1024], version=version)
    raise ProtocolError(f"unknown reply type {t[:32]!r}")
