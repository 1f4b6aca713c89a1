"""Fetching a peer's snapshot: a DEALER socket, a window sized to the link, checks on every byte.

One exchange: HELLO (the server streams the first window at once, saving a round trip) ->
MANIFEST -> CHUNKs, more GETs sent as chunks arrive so that `window` bytes stay in flight. Chunks arrive in request order on one
connection; each is checked against the manifest (range, block digests, finite values) and decoded
straight into the fp32 result (see `payload.py`) while a second thread verifies digests, so memory
beyond the state is the window plus at most three received chunks awaiting their check.

Failures raise a `TransportError` subclass and never return a partial state: `TransportTimeout`
(nothing heard for `timeout` seconds, or a few chunks' time on a slow link), `ConnectionLost` (the
peer dropped mid-exchange), `VersionGone` (the snapshot was replaced and evicted), `AuthRefused`
(secret handshake failed), `ProtocolMismatch` (other major version), `BadPayload`/`ProtocolError` (the peer broke the rules).
`push` (1.1) sends this side's own snapshot, for an island nobody can dial (`push.py` receives it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import (
    AuthRefused, BadPayload, ConnectionLost, FetchCancelled, ProtocolError, ProtocolMismatch, TransportError,
    TransportTimeout, VersionGone
)
from p2p_diloco.exchange import flowcontrol, payload, wire
from p2p_diloco.exchange.linkemu import EmulatedLink, pacer
from p2p_diloco.exchange.sockets import HANDSHAKE_FAILED, client_context, swarm_keys
from p2p_diloco.exchange.transfer import VERIFY_BACKLOG, Transfer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchStats:
    rtt_s: float  # smallest round trip this fetch saw (the HELLO's, or a chunk's), else the remembered one
    link_bytes_per_s: float  # bottleneck bandwidth estimate at the end
    peak_window_bytes: int  # most bytes kept in flight
    chunk_bytes: int  # chunk length in use at the end
    chunks: int
    transfer_bytes_per_s: float  # payload bytes / (seconds - rtt_s): the rate once one round trip is paid
    data_bytes_per_s: float = math.nan  # bytes after the first chunk over the time they took to arrive (NaN: 1 chunk)


@dataclass(frozen=True)
class Snapshot:
    """A peer's state, fetched whole and checked: fp32 tensors in their published shapes."""

    tensors: dict[str, torch.Tensor]
    version: int
    tokens: int
    meta: dict[str, Any]
    nbytes: int  # payload bytes that travelled
    wire_bytes: int  # every frame both ways, headers included (`exchange.cost` says what is not)
    seconds: float
    endpoint: str
    stats: FetchStats
    manifest: wire.Manifest = field(repr=False)


CANCEL_CHECK_S = 0.05
"""While it waits for a chunk, a fetch looks this often whether it was given up (`Fetcher.cancel`)."""
REFUSAL_WAIT_MS = 500
"""A send with nowhere to go waits this long for the monitor to say the peer refused the handshake."""


class Fetcher:
    """A connection to one peer's snapshot server; reuse it to fetch from that peer repeatedly."""

    def __init__(self, endpoint: str, config: NetworkConfig | None = None, peer: str | None = None, *,
                 secret: str | None = None, link: EmulatedLink | None = None) -> None:
        """`peer`: that peer's state via a relay at `endpoint`; `link`: an emulated WAN link (benchmarks)."""
        self.endpoint, self.peer = endpoint, peer
        self.config = config or NetworkConfig()
        self._rid = self.wire_bytes = 0
        self._transfer: Transfer | None = None
        self._cancelled = threading.Event()
        self._up = False
        self._pool: ThreadPoolExecutor | None = None
        self._pacer = pacer(link)
        sock = client_context().socket(zmq.DEALER)
        self._sock = sock
        try:
            sock.linger = 0
            sock.setsockopt(zmq.MAXMSGSIZE, max(wire.MAX_CHUNK, wire.MAX_MANIFEST_BYTES) + wire.FRAME_OVERHEAD)
            sock.rcvhwm = sock.sndhwm = wire.MAX_INFLIGHT + 16
            if secret is not None:
                keys = swarm_keys(secret)
                sock.curve_serverkey = keys.server_public
                sock.curve_publickey = keys.client_public
                sock.curve_secretkey = keys.client_secret
            self._monitor = sock.get_monitor_socket(HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                                                    | zmq.EVENT_DISCONNECTED)
            sock.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"cannot connect to {endpoint}: {e}") from e
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)

    # -- public -----------------------------------------------------------------------------------

    def data_progress(self) -> tuple[float, float]:
        """The running fetch's seconds since its first chunk arrived and its data rate since (bytes per
        second; NaN before a second chunk): for another thread to judge it by (`core.linkfit`)."""
        tr = self._transfer
        if tr is None or tr.first_at is None:
            return 0.0, math.nan
        return time.monotonic() - tr.first_at, tr.data_rate()

    def cancel(self) -> None:
        """Give up the running fetch (from another thread): it raises `FetchCancelled` at its next chunk."""
        self._cancelled.set()

    def manifest(self, timeout: float | None = None) -> wire.Manifest:
        """The peer's current manifest (version, tokens, meta, layout) without the payload: one RTT."""
        timeout = timeout or self.config.fetch_timeout_s
        self._drain_monitor(busy=False)
        first, t0 = self._rid + 1, time.monotonic()
        hello = wire.Hello(rid=self._next_rid(), peer=self.peer)
        self._send(hello)
        m = self._await_manifest(first, timeout, t0)
        if (prior := flowcontrol.remembered(self.endpoint)) is not None:  # a smaller round trip is worth keeping
            flowcontrol.remember(self.endpoint, flowcontrol.LinkEstimate(min(prior.rtt_s, time.monotonic() - t0), prior.bytes_per_s))
        return m

    def fetch(self, timeout: float | None = None, decode: bool = True, pub: bool = False,
              held: tuple[str, int] | None = None, want: int | None = None, wait_s: float = 0.0,
              rate_hint: float = 0.0) -> Snapshot:
        """Download the peer's latest snapshot whole; `timeout` is the longest wait for progress.

        With `decode=False` the tensors stay in their encoded bytes (`codecs.EncodedVector`, a
        quarter of the fp32 memory for int8), checked the same way, decoded later a slice at a time.
        1.1: with `pub`, the public state or the updates since `held`, the (chain, version) held;
        with `want`, the server answers once it has published that version, or after `wait_s`.
        `rate_hint`: a link rate the caller measured, for a link this connection has not (`silence_s`).
        """
        self._drain_monitor(busy=False)
        cfg = self.config
        ctl = flowcontrol.WindowController.for_config(cfg, prior=flowcontrol.remembered(self.endpoint))
        timeout = ctl.silence_s(timeout or cfg.fetch_timeout_s, wire.MIN_CHUNK, rate_hint)
        first, t0 = self._rid + 1, time.monotonic()
        hello = wire.Hello(rid=self._next_rid(), prefetch=ctl.window_bytes(wire.MIN_CHUNK),
                           chunk=ctl.chunk_bytes(wire.MIN_CHUNK), peer=self.peer, pub=pub,
                           chain=held[0] if held else None, since=held[1] if held else None, want=want,
                           wait_ms=min(wire.MAX_WAIT_MS, round(wait_s * 1000)) if want is not None else 0)
        self._send(hello)
        m = self._await_manifest(first, timeout, t0, hello.wait_ms / 1000)
        if hello.want is None:
            ctl.on_rtt(time.monotonic() - t0)
        else:  # the server held its answer: no round-trip sample, and the transfer began a round trip ago
            t0 = time.monotonic() - (ctl.rtt if math.isfinite(ctl.rtt) else 0.0)
        if (need := m.state_bytes if decode else m.total) > cfg.max_state_bytes:  # what this fetch allocates
            raise BadPayload(f"{self.endpoint} offers {need} bytes of state, over max_state_bytes")
        asm, tr = payload.Assembler(m, keep_encoded=not decode), Transfer.after(hello, m, time.monotonic() + timeout)
        self._transfer = tr
        while not asm.done:
            if self._cancelled.is_set():
                raise FetchCancelled(f"the fetch from {self.endpoint} was given up after {tr.chunks} chunks")
            tr.collect_done()
            self._request_window(tr, ctl, m)
            reply = self._wait(tr.stall, m, first, timeout)
            if reply.rid >= first:  # else a late answer to an earlier, abandoned exchange
                self._take_chunk(tr, ctl, asm, m, reply, timeout)
        tr.collect_down_to(0)
        return self._finished(asm, m, ctl, tr, time.monotonic() - t0)

    def _request_window(self, tr: Transfer, ctl: flowcontrol.WindowController, m: wire.Manifest) -> None:
        """Ask for chunks until the window (and the protocol's request limit) is full."""
        window = ctl.window_bytes(m.block)
        while tr.next_off < m.total and tr.in_bytes < window and len(tr.inflight) < wire.MAX_INFLIGHT:
            n = min(ctl.chunk_bytes(m.block), m.total - tr.next_off)
            req = wire.GetChunk(rid=self._next_rid(), sid=m.sid, offset=tr.next_off, length=n)
            self._send(req)
            tr.inflight.append((tr.next_off, n, req.rid, time.monotonic()))
            tr.next_off += n
            tr.in_bytes += n

    def _take_chunk(self, tr: Transfer, ctl: flowcontrol.WindowController, asm: payload.Assembler,
                    m: wire.Manifest, reply: Any, timeout: float) -> None:
        """Check that a reply is the next chunk asked for, measure the link by it, and decode it
        while the verify thread checks its digests and values."""
        now = time.monotonic()
        if not isinstance(reply, wire.ChunkReply):
            raise ProtocolError(f"{self.endpoint} sent an unexpected {type(reply).__name__} mid-transfer")
        off, n, rid, sent = tr.inflight.popleft()
        if (reply.sid, reply.offset, reply.length, reply.rid) != (m.sid, off, n, rid):
            raise ProtocolError(f"{self.endpoint} sent chunk [{reply.offset}, +{reply.length}) of {reply.sid} "
                                f"(rid {reply.rid}); expected [{off}, +{n}) of {m.sid} (rid {rid})")
        ctl.on_delivery(n, now)
        tr.arrived(n, now)
        if sent is not None:
            ctl.on_rtt(now - sent)
        tr.chunks, tr.stall = tr.chunks + 1, now + timeout
        tr.verifying.append(self._verifier().submit(asm.verify, reply.offset, reply.payload))
        asm.decode(reply.offset, reply.payload)  # meanwhile, on this thread
        tr.in_bytes -= n
        tr.collect_down_to(VERIFY_BACKLOG)

    def _finished(self, asm: payload.Assembler, m: wire.Manifest, ctl: flowcontrol.WindowController, tr: Transfer,
                  seconds: float) -> Snapshot:
        """The whole, checked snapshot, with the link's figures (remembered for the next fetch)."""
        flowcontrol.remember(self.endpoint, ctl.estimate())
        busy = seconds - ctl.rtt  # a request's trip out and the last byte's trip back are unavoidable
        stats = FetchStats(rtt_s=ctl.rtt, link_bytes_per_s=ctl.bandwidth, peak_window_bytes=ctl.peak_window,
                           chunk_bytes=ctl.chunk_bytes(m.block), chunks=tr.chunks,
                           transfer_bytes_per_s=m.total / busy if busy > 0 else math.nan, data_bytes_per_s=tr.data_rate())
        self._transfer = None
        log.debug("fetched version %d from %s: %d bytes in %.3f s", m.version, self.endpoint, m.total, seconds)
        wire_bytes, self.wire_bytes = self.wire_bytes, 0  # this fetch's, and those of manifests polled before it
        return Snapshot(tensors=asm.result(), version=m.version, tokens=m.tokens, meta=dict(m.meta),
                        nbytes=m.total, wire_bytes=wire_bytes, seconds=seconds, endpoint=self.endpoint,
                        stats=stats, manifest=m)

    def push(self, manifest: wire.Manifest, payload: memoryview, timeout: float | None = None) -> int:
        """Deliver our own snapshot (`manifest` and its payload bytes) to the peer; the bytes sent.

        Puts of whole blocks go out as fast as the peer's grants allow; returns once the peer has
        checked the whole state (`stored`), raises `TransportError` (its subclass per error code) if
        it refuses the push or goes quiet for `timeout` seconds.
        """
        timeout = timeout or self.config.fetch_timeout_s
        self._drain_monitor(busy=False)
        first = rid = self._next_rid()
        self._send(wire.PushOffer(rid=rid, manifest=manifest))
        sent = granted = 0
        step = wire.MAX_PUT - wire.MAX_PUT % manifest.block  # whole blocks (the receiver checks them so)
        stall = time.monotonic() + timeout
        while True:
            while sent < granted:
                n = min(step, granted - sent)
                self._send(wire.PushPut(rid=rid, sid=manifest.sid, offset=sent, length=n, payload=payload[sent:sent + n]))
                sent += n
            reply = self._wait(stall, manifest, first, timeout)
            if reply.rid < first:
                continue
            if isinstance(reply, wire.PushStored) and sent == manifest.total:
                return sent
            if not isinstance(reply, wire.PushGrant) or reply.sid != manifest.sid or reply.upto > manifest.total:
                raise ProtocolError(f"{self.endpoint} answered a push with {reply!r:.80}")
            granted, stall = max(granted, reply.upto), time.monotonic() + timeout

    def close(self) -> None:
        self._pacer.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        sock = getattr(self, "_sock", None)
        if sock is not None and not sock.closed:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            sock.close(linger=0)
        mon = getattr(self, "_monitor", None)
        if mon is not None and not mon.closed:
            mon.close(linger=0)

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _verifier(self) -> ThreadPoolExecutor:
        """One thread that digests and checks chunks while this one decodes (both release the GIL)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fetch-verify")
        return self._pool

    def _next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def _send(self, msg: wire.Request) -> None:
        frames = wire.encode(msg)
        if self._pacer.active:
            self._pacer.schedule(sum(len(f) for f in frames), frames)
        else:
            self._send_now(frames)

    def _send_now(self, frames: list[Any]) -> None:
        self.wire_bytes += wire.frames_size(frames)
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == zmq.EAGAIN:  # a refused handshake drops the connection: its event may be on its way
                self._monitor.poll(REFUSAL_WAIT_MS)
                self._drain_monitor(busy=False)
            raise TransportError(f"cannot send to {self.endpoint}: {e}") from e

    def _await_manifest(self, first: int, timeout: float, t0: float, wait_s: float = 0.0) -> wire.Manifest:
        stall = t0 + timeout
        while True:
            reply = self._wait(stall, None, first, timeout)
            if reply.rid < first:
                continue
            if isinstance(reply, wire.ManifestReply):
                return reply.manifest
            if not isinstance(reply, wire.Waiting):
                raise ProtocolError(f"{self.endpoint} answered HELLO with {type(reply).__name__}")
            stall = time.monotonic() + wait_s + timeout  # it holds our HELLO (`want`): the wait, then the timeout

    def _wait(self, stall: float, m: wire.Manifest | None, first: int,
              timeout: float) -> wire.ManifestReply | wire.Waiting | wire.ChunkReply:
        """Send what the pacer releases; return the next reply (or raise for an ERROR or silence)."""
        while True:
            now = time.monotonic()
            for frames in self._pacer.pop_due(now):
                self._send_now(frames)
            try:
                try:  # data is usually waiting already: skip the poll
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    if self._cancelled.is_set():
                        raise FetchCancelled(f"the fetch from {self.endpoint} was given up") from None
                    if now >= stall:
                        raise TransportTimeout(f"no answer from {self.endpoint} for {timeout:g} s"
                                               + ("" if m is None else " in the middle of a transfer")) from None
                    due = self._pacer.next_due()
                    wait = stall - now if due is None else min(stall - now, max(0.0, due - now))
                    wait = min(wait, CANCEL_CHECK_S)
                    events = dict(self._poller.poll(math.ceil(wait * 1000)))
                    if self._monitor in events:
                        self._drain_monitor(busy=True)
                    continue
            except zmq.ZMQError as e:
                raise TransportError(f"receiving from {self.endpoint} failed: {e}") from e
            self.wire_bytes += wire.frames_size([f.buffer for f in frames])
            reply = wire.decode_reply(frames)
            if isinstance(reply, wire.ErrorReply):
                if reply.rid >= first or reply.rid == 0:  # 0: the server could not read our rid
                    self._raise(reply, m)
                continue
            return reply

    def _raise(self, e: wire.ErrorReply, m: wire.Manifest | None) -> None:
        where = self.endpoint
        if e.code == "gone":
            err = VersionGone(f"{where} no longer serves version {m.version if m else '?'}"
                              f" (it now serves version {e.version}); fetch again for the new one")
            err.version, err.current = (m.version if m else None), e.version
            raise err
        if e.code == "version":
            raise ProtocolMismatch(f"{where} refused our protocol version: {e.message}")
        if e.code == "no_snapshot":
            raise TransportError(f"{where} has no snapshot to give: {e.message}")
        if e.code == "busy":
            raise TransportError(f"{where} is busy: {e.message}")
        if e.code == "refused":
            raise TransportError(f"{where} refused our push: {e.message}")
        raise ProtocolError(f"{where} rejected our request ({e.code}): {e.message}")

    def _drain_monitor(self, busy: bool) -> None:
        while True:
            try:
                ev = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = ev["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._up = True
            elif kind & HANDSHAKE_FAILED:
                # a peer closing the socket under a handshake reads like a refusal (NO_DETAIL, broken pipe)
                gone = ", or the peer was shutting down" if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL else ""
                raise AuthRefused(f"{self.endpoint} refused the security handshake ({zmq.Event(kind).name}): "
                                  f"the swarm secret is missing or different on one side{gone}")
            elif kind == zmq.EVENT_DISCONNECTED:
                was_up, self._up = self._up, False
                if busy and was_up:
                    raise ConnectionLost(f"{self.endpoint} closed the connection mid-exchange")


def fetch(endpoint: str, config: NetworkConfig | None = None, timeout: float | None = None,
          decode: bool = True, *, secret: str | None = None, link: EmulatedLink | None = None) -> Snapshot:
    """Fetch `endpoint`'s latest snapshot over a fresh connection (see `Fetcher.fetch`)."""
    with Fetcher(endpoint, config, secret=secret, link=link) as f:
        return f.fetch(timeout, decode=decode)


def fetch_manifest(endpoint: str, config: NetworkConfig | None = None, timeout: float | None = None, *,
                   secret: str | None = None) -> wire.Manifest:
    """Fetch only `endpoint`'s manifest: version, tokens and meta for choosing a partner."""
    with Fetcher(endpoint, config, secret=secret) as f:
        return f.manifest(timeout)
