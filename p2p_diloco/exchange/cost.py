"""What one whole-state fetch costs on the wire, message by message: the bytes the simulator charges.

The messages are those a `Fetcher` sends and receives over a connection with no remembered link
figures: the HELLO (asking for the prefetch a fresh window asks for), the MANIFEST (tensor specs,
meta and one digest per block), the CHUNKs the HELLO prefetched, then GETs and CHUNKs for the rest;
every frame with its ZMTP frame header (2 bytes up to 255, else 9). Built with the protocol's own
encoders (`wire.encode`), so the count follows the protocol when it changes. A client that knows
the link chunks by its measured rate instead, which moves a few dozen header bytes, not payload.
Not counted, by the simulator or by `Fetcher.wire_bytes`: the connection's handshake (ZMTP greeting
and, with a secret, CurveZMQ's, once per partner) and TCP/IP headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from p2p_diloco.config import NetworkConfig
from p2p_diloco.core.public import update_name
from p2p_diloco.exchange import flowcontrol, wire
from p2p_diloco.exchange.payload import layout

REPRESENTATIVE_META = {"peer_id": "0" * 20, "model": "0" * 16, "run": "0" * 16}
"""An island's manifest meta (`peers.gossip.publishing.Publisher`): the same keys and value lengths."""
CHAIN = "0" * 16
"""A public state's chain id (`core.public.PublicState.chain`): the same length."""


def public_fetch_wire_bytes(numel: int, codec: str, start: int | None, version: int, held: tuple[str, int] | None,
                            config: NetworkConfig | None = None, spans: Sequence[tuple[int, int]] | None = None,
                            parts: int = 1) -> int:
    """Bytes both ways of one fetch of a public state (`exchange.public_views`): the updates from
    `start` to `version` in `codec` (`spans`: each one's first value and count, where not whole), or
    (`start` None) the public state whole, asked with `held`; `parts`: the last update's fragments."""
    meta = {**REPRESENTATIVE_META, "pub_chain": CHAIN, "pub_version": version, "pub_digest": "0" * 16,
            **({"pub_parts": parts} if parts > 1 else {})}
    if start is None:
        tensors = [("pub", numel, "fp32")]
    else:
        spans = spans or [(0, numel)] * (version - start)
        tensors = [(update_name(start + 1 + k, at, n != numel), n, codec) for k, (at, n) in enumerate(spans)]
        meta["pub_from"] = start
    hello = {"pub": True, **({} if held is None else {"chain": held[0], "since": held[1]})}
    return fetch_wire_bytes(tensors, meta=meta, config=config, hello=hello)


def fetch_wire_bytes(tensors: Sequence[tuple[str, int, str]], version: int = 1, tokens: int = 1,
                     meta: Mapping[str, Any] = REPRESENTATIVE_META, config: NetworkConfig | None = None,
                     hello: Mapping[str, Any] | None = None) -> int:
    """Bytes both ways of one fetch of a snapshot holding `tensors` (`(name, numel, codec)`); `hello`:
    the HELLO's optional fields (`wire.Hello`)."""
    specs, total = layout([(name, (numel,), codec) for name, numel, codec in tensors])
    block = wire.choose_block(total)
    manifest = wire.Manifest(sid=(1 << 63) - 1, version=version, tokens=tokens, meta=dict(meta), tensors=specs,
                             total=total, block=block, digests=bytes(wire.DIGEST_SIZE * -(-total // block)))
    ctl = flowcontrol.WindowController.for_config(config or NetworkConfig())
    hello = wire.Hello(rid=1, prefetch=ctl.window_bytes(wire.MIN_CHUNK), chunk=ctl.chunk_bytes(wire.MIN_CHUNK),
                       **(hello or {}))
    n = sum(wire.frames_size(wire.encode(msg)) for msg in (hello, wire.ManifestReply(rid=1, manifest=manifest)))
    plan = wire.prefetch_plan(total, block, hello.prefetch, hello.chunk)
    rid, off = 1, plan[-1][0] + plan[-1][1] if plan else 0
    rest = []
    while off < total:
        rest.append((off, min(ctl.chunk_bytes(block), total - off)))
        off += rest[-1][1]
    for k, (off, length) in enumerate([*plan, *rest]):
        if k >= len(plan):  # asked for: a GET out, its CHUNK back
            rid += 1
            n += wire.frames_size(wire.encode(wire.GetChunk(rid=rid, sid=manifest.sid, offset=off, length=length)))
        header = wire.encode(wire.ChunkReply(rid=rid, sid=manifest.sid, offset=off, length=length))[0]
        n += wire.frames_size([header]) + wire.frame_size(length)
    return n
