"""The state exchange's ROUTER snapshot server (`SnapshotServer`), driven by one background thread
so the training loop never waits on the network. `publish()` swaps in a new snapshot atomically;
older ones stay while a fetch still reads them (`shelf.py`). Every request is size-bounded by the
socket (`MAXMSGSIZE`) before it is parsed; a bad one gets an ERROR reply and a logged reason, and the
server carries on. Payload chunks are zero-copy slices of the snapshot buffer.

The fetching side (DEALER) is `client.py`. Protocol 1.1 adds pushes (`push.py`) from an island
nobody can dial, taken when the `pushes` policy admits them; a relay (`relay=True`, on the bootstrap
node) serves each member's latest push to fetchers that name the peer in their HELLO. A HELLO with
`pub` gets the public state or its updates (`public_views.py`); one with `want` waits for it
(`parked.py`). With a swarm secret the server demands CURVE with keys derived from it, and a ZAP
handler admits only the derived client key (`sockets.py`): a peer without the secret can neither
read state nor get a request accepted.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
import zmq
import zmq.auth.thread
from zmq.utils.monitor import recv_monitor_message

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import ProtocolError, ProtocolMismatch, TransportError
from p2p_diloco.exchange import payload, wire
from p2p_diloco.exchange.parked import ParkedHellos
from p2p_diloco.exchange.payload import Published
from p2p_diloco.exchange.public_views import PublicView, PublicViews
from p2p_diloco.exchange.linkemu import EmulatedLink, pacer
from p2p_diloco.exchange.push import NoPushes, PushPolicy, PushReceiver, PushRefused, RelayPolicy
from p2p_diloco.exchange.shelf import Shelf
from p2p_diloco.exchange.sockets import (
    HANDSHAKE_FAILED, ZAP_DOMAIN, AllowClientKey, RateLimitedLog, swarm_keys, tcp_bind_address
)

log = logging.getLogger(__name__)
RCVHWM = 64
"""Requests queued per connection before ZeroMQ stops reading it (TCP back-pressure, nothing
dropped): with pushes a frame may hold 1 MiB, so this bounds a connection's queue to 64 MiB."""
BACKLOG_SLACK = 64
"""Replies held beyond the protocol's limit for a connection that stopped reading (one ignoring `busy`)."""


class SnapshotServer:
    """Serves this island's latest snapshot to any number of fetchers, from a background thread."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0", config: NetworkConfig | None = None, *,
                 secret: str | None = None, announce_host: str | None = None,
                 pushes: PushPolicy | None = None, relay: bool = False, link: EmulatedLink | None = None) -> None:
        """`secret`: only its holders can fetch or push; `link`: an emulated WAN link (benchmarks)."""
        self.config = config or NetworkConfig()
        self.secret = secret
        self.relay = relay
        self._relay = RelayPolicy() if relay else None
        self._push = PushReceiver(self._relay or pushes or NoPushes(), require_hello=not relay,
                                  max_state_bytes=self.config.max_state_bytes)
        self._ctx = zmq.Context(io_threads=1)
        self._auth: zmq.auth.thread.ThreadAuthenticator | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reject = RateLimitedLog(log)
        self._shelf = Shelf(self.config.retain_snapshots, hold_s=self.config.fetch_timeout_s)
        self._public = PublicViews()
        self._parked = ParkedHellos()  # HELLOs waiting for the version they want (socket thread only)
        self._pacer = pacer(link, self.config.max_upload_mbps)
        self._stats = {"requests": 0, "manifests_served": 0, "chunks_served": 0, "bytes_sent": 0,
                       "payload_bytes_sent": 0, "auth_refused": 0, "rejected": {}}
        self._sent_log: deque[tuple[float, int]] = deque(maxlen=4096)
        self._backlog: dict[bytes, deque] = {}  # replies ZeroMQ could not take yet, per connection
        try:
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.linger = 0
            self._sock.setsockopt(zmq.MAXMSGSIZE, max(wire.MAX_OFFER_BYTES, wire.MAX_PUT) + wire.FRAME_OVERHEAD)
            self._sock.router_mandatory = 1  # sending to a peer that left raises, so its backlog can go
            self._sock.rcvhwm = RCVHWM
            self._sock.sndhwm = 2 * wire.MAX_INFLIGHT  # past it, replies wait in `_backlog` (and `busy` is sent)
            if self.secret is not None:
                keys = swarm_keys(self.secret)
                self._auth = zmq.auth.thread.ThreadAuthenticator(self._ctx, log=logging.getLogger(__name__ + ".zap"))
                self._auth.start()
                self._auth.configure_curve_callback(ZAP_DOMAIN, AllowClientKey(keys.client_public, self._refused))
                self._sock.curve_server = True
                self._sock.curve_secretkey = keys.server_secret
                self._sock.curve_publickey = keys.server_public
                self._sock.zap_domain = ZAP_DOMAIN.encode()
            self._monitor = self._sock.get_monitor_socket(HANDSHAKE_FAILED)
            self._sock.bind(tcp_bind_address(bind))
        except zmq.ZMQError as e:
            self._teardown()
            raise TransportError(f"cannot serve snapshots on {bind}: {e}") from e
        bound = self._sock.last_endpoint.decode()
        self.endpoint = f"tcp://{announce_host}:{bound.rsplit(':', 1)[1]}" if announce_host else bound
        self._thread = threading.Thread(target=self._run, name="snapshot-server", daemon=True)
        self._thread.start()
        log.info("serving snapshots on %s (secret %s)", self.endpoint, "on" if self.secret else "off")

    # -- the training side ------------------------------------------------------------------------

    def publish(self, tensors: Mapping[str, torch.Tensor], version: int, tokens: int,
                meta: Mapping[str, Any] | None = None, codec_of: Mapping[str, str] | None = None) -> wire.Manifest:
        """Snapshot `tensors` (copied, encoded with the configured codec, or `codec_of[name]`) and serve
        it from now on. The newest `retain_snapshots` stay served, and older ones while a fetch still
        reads them (`shelf.Shelf`): a transfer that spans rounds on a slow link completes."""
        self._shelf.drop_oldest()
        manifest, buf = payload.pack(tensors, self.config.compression, version=version, tokens=tokens, meta=meta,
                                     codec_of=codec_of)
        self._shelf.put(Published.of(manifest, buf))
        log.debug("published version %d (%d bytes, %d blocks)", version, manifest.total, manifest.n_blocks)
        return manifest

    def publish_public(self, view: PublicView) -> None:
        """Serve `view` to clients that ask for the public state (`hello.pub`) from now on."""
        self._public.publish(view)

    @property
    def public(self) -> PublicViews:  # (under its `changing()` lock an island changes the public state in place)
        return self._public

    def stats(self) -> dict[str, Any]:
        """Counters for the dashboard: requests, bytes sent, rejections by reason, upload rate."""
        with self._lock:
            out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._stats.items()}
        out["upload_bytes_per_s"] = self.sent_within(2.0) / 2.0
        out["version"] = self._latest.manifest.version if self._latest else None
        out["snapshots_held"] = len(self._shelf.held())
        out["hellos_waiting"] = len(self._parked)
        out.update(self._push.stats)
        return out

    def published_last(self) -> None:
        """Nothing newer will be published (the island is leaving): HELLOs waiting for a newer version
        are answered with the latest now, and no new one waits."""
        self._parked.final = True

    def sent_within(self, seconds: float) -> int:
        """Bytes sent over the last `seconds` (of the last 4096 replies)."""
        with self._lock:
            now = time.monotonic()
            return sum(n for t, n in self._sent_log if now - t <= seconds)

    def latest(self) -> tuple[wire.Manifest, memoryview] | None:
        """The snapshot served now and its payload bytes (what this island pushes to a partner), or None."""
        snap = self._latest
        return None if snap is None else (snap.manifest, snap.view)

    @property
    def _latest(self) -> Published | None:
        return self._shelf.latest

    @property
    def _relayed(self) -> dict[str, Published]:  # a relay's latest pushed snapshot of each peer, by peer id
        return {} if self._relay is None else self._relay.states

    def relayed(self) -> dict[str, int]:
        """A relay's held states: peer id -> version."""
        return {peer: snap.manifest.version for peer, snap in dict(self._relayed).items()}

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving; pending replies are dropped. Safe to call twice."""
        self._stop.set()
        if getattr(self, "_thread", None) is not None and self._thread.is_alive():
            self._thread.join(timeout)
        self._teardown()

    def __enter__(self) -> SnapshotServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _teardown(self) -> None:
        for name in ("_monitor", "_sock"):
            sock = getattr(self, name, None)
            if sock is not None and not sock.closed:
                if name == "_sock":
                    try:
                        sock.disable_monitor()
                    except zmq.ZMQError:
                        pass
                sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if not self._ctx.closed:
            self._ctx.term()

    # -- the socket thread ------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                due = self._pacer.next_due()
                wait = 0.05 if due is None else min(0.05, max(0.0, due - time.monotonic()))
                events = dict(poller.poll(math.ceil(wait * 1000)))
                if self._sock in events:
                    for _ in range(4 * wire.MAX_INFLIGHT):
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        try:
                            self._handle(frames)
                        except Exception:  # a bug must not take the server down for everyone
                            log.exception("error while handling a request; still serving")
                if self._monitor in events:
                    self._drain_monitor()
                if len(self._parked):
                    for ident, req, peer in self._parked.due(self._version_for, time.monotonic()):
                        self._answer_hello(ident, req, peer)
                if self._backlog:
                    self._flush_backlog()
                if len(self._pacer):
                    for ident, frames, nbytes in self._pacer.pop_due():
                        self._send(ident, frames, nbytes)
        except zmq.ZMQError as e:  # the context went away under us: nothing left to serve
            if not self._stop.is_set():
                log.error("snapshot server stopped: %s", e)

    def _drain_monitor(self) -> None:
        while True:
            try:
                ev = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] & HANDSHAKE_FAILED and self.secret is not None:
                self._refused(f"security handshake failed ({zmq.Event(ev['event']).name}, code {ev['value']})")
            elif ev["event"] & HANDSHAKE_FAILED:  # no secret: a peer that stalled mid-greeting, or not a ZMTP peer
                log.debug("a connection failed its ZMTP greeting (%s, code %d)", zmq.Event(ev["event"]).name, ev["value"])

    def _refused(self, reason: str) -> None:
        with self._lock:
            self._stats["auth_refused"] += 1
        self._reject("auth", "refused a connection: %s", reason)

    def _reply(self, ident: bytes, msg: Any, charge: int = 0) -> None:
        """Send now, or when link emulation or the upload cap lets it go; `charge` counts bytes the
        message lets a pusher send against the upload cap (a grant), so pushes share it."""
        frames = wire.encode(msg)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        if self._pacer.active:
            cost = nbytes + (charge if self.config.max_upload_mbps else 0)
            self._pacer.schedule(cost, (ident, frames, nbytes), flow=ident)
        else:
            self._send(ident, frames, nbytes)

    def _send(self, ident: bytes, frames: list[Any], nbytes: int) -> bool:
        """Hand a reply to ZeroMQ; one it cannot take now (the peer is not reading) waits in the
        connection's backlog, in order. False when it was not sent now."""
        backlog = self._backlog.get(ident)
        if backlog:  # keep the order: behind what already waits
            self._hold(ident, backlog, frames, nbytes)
            return False
        with self._lock:  # counted first: the peer may read the reply before send_multipart returns
            self._stats["bytes_sent"] += nbytes
            self._sent_log.append((time.monotonic(), nbytes))
        try:
            self._sock.send_multipart([ident, *frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as e:
            with self._lock:
                self._stats["bytes_sent"] -= nbytes
            if e.errno == zmq.EHOSTUNREACH:  # the peer left: forget what is still queued for it
                dropped = self._pacer.drop(ident) + len(self._backlog.pop(ident, ()))
                self._push.forget(ident)
                log.info("a peer left mid-exchange; dropped %d replies queued for it", dropped + 1)
            else:  # its queue is full: it stopped reading (or broke the in-flight limit)
                self._hold(ident, self._backlog.setdefault(ident, deque()), frames, nbytes)
            return False

    def _hold(self, ident: bytes, backlog: deque, frames: list[Any], nbytes: int) -> None:
        if len(backlog) >= wire.MAX_INFLIGHT + 8 + BACKLOG_SLACK:
            self._reject("send", "dropped a reply to a connection that reads nothing and ignores busy")
            return
        backlog.append((frames, nbytes))

    def _flush_backlog(self) -> None:
        """Send what waits for connections that read again, in order, until one is full again."""
        for ident in list(self._backlog):
            backlog = self._backlog.pop(ident)
            while backlog:
                frames, nbytes = backlog.popleft()
                if not self._send(ident, frames, nbytes):  # full again: the rest waits behind it
                    self._backlog.setdefault(ident, deque()).extend(backlog)
                    break

    def _error(self, ident: bytes, rid: int, code: str, message: str, peer: str) -> None:
        assert code in wire.ERROR_CODES, code
        with self._lock:
            rejected = self._stats["rejected"]
            rejected[code] = rejected.get(code, 0) + 1
        self._reject(code, "rejected a request from %s: %s", peer, message)
        latest = self._latest
        self._reply(ident, wire.ErrorReply(rid=rid, code=code, message=message,
                                           version=latest.manifest.version if latest else None))

    def _handle(self, frames: list[zmq.Frame]) -> None:
        ident = frames[0].bytes
        with self._lock:
            self._stats["requests"] += 1
        try:
            peer = frames[1].get("Peer-Address") if len(frames) > 1 else "?"
        except zmq.ZMQError:
            peer = "?"
        try:
            req = wire.decode_request(frames[1:])
        except ProtocolMismatch as e:
            self._error(ident, getattr(e, "rid", 0), "version", f"server speaks protocol "
                        f"{wire.PROTOCOL_VERSION[0]}.{wire.PROTOCOL_VERSION[1]}, request was "
                        f"{'.'.join(map(str, getattr(e, 'peer_version', ('?', '?'))))}", peer)
            return
        except ProtocolError as e:  # the rid is echoed whenever it could be read
            self._error(ident, getattr(e, "rid", 0), "bad_request", str(e), peer)
            return
        if self._pacer.held(ident) + len(self._backlog.get(ident, ())) >= wire.MAX_INFLIGHT + 8:  # slack: manifest, errors
            self._error(ident, req.rid, "busy", f"more than {wire.MAX_INFLIGHT} requests outstanding", peer)
        elif isinstance(req, wire.Hello):
            self._hello(ident, req, peer)
        elif isinstance(req, wire.GetChunk):
            self._get(ident, req, peer)
        else:
            self._pushed(ident, req, peer)

    def _pushed(self, ident: bytes, req: wire.PushOffer | wire.PushPut, peer: str) -> None:
        try:
            if isinstance(req, wire.PushOffer):
                reply, charge = self._push.offer(ident, req, peer, time.monotonic())
            else:
                reply, charge = self._push.put(ident, req, time.monotonic())
        except PushRefused as e:
            self._error(ident, req.rid, e.code, str(e), peer)
            return
        if reply is not None:
            self._reply(ident, reply, charge)

    def _hello(self, ident: bytes, req: wire.Hello, peer: str) -> None:
        now = time.monotonic()
        self._push.saw_hello(ident, now)
        waits = req.want is not None and req.wait_ms > 0 and (version := self._version_for(req)) < req.want
        answer_now = self._parked.park(ident, req, peer, now) if waits else [(ident, req, peer)]
        if waits and (ident, req, peer) not in answer_now:
            self._reply(ident, wire.Waiting(rid=req.rid, version=version))
        for held in answer_now:  # (what cannot wait, and a connection's older HELLO)
            self._answer_hello(*held)

    def _version_for(self, req: wire.Hello) -> int:
        """The version a HELLO would be answered with now (-1: nothing published)."""
        public = self._public.outer_version if req.pub and req.peer is None else None
        snap = self._state_for(req.peer)
        return public if public is not None else snap.manifest.version if snap else -1

    def _state_for(self, peer: str | None) -> Published | None:
        """This island's latest snapshot, or the one a relay holds for `peer` (what a HELLO without
        `pub` gets, and one with `pub` from an island that publishes no public state)."""
        return self._latest if peer is None else self._relayed.get(peer)

    def _answer_hello(self, ident: bytes, req: wire.Hello, peer: str) -> None:
        snap = (self._public.answer(req) if req.pub and req.peer is None else None) or self._state_for(req.peer)
        if snap is None:
            what = "nothing published yet" if req.peer is None else f"no state of peer {req.peer[:20]} relayed here"
            self._error(ident, req.rid, "no_snapshot", what, peer)
            return
        with self._lock:
            self._stats["manifests_served"] += 1
        self._reply(ident, wire.ManifestReply(rid=req.rid, manifest=snap.manifest))
        m = snap.manifest
        for off, length in wire.prefetch_plan(m.total, m.block, req.prefetch, req.chunk):
            self._chunk(ident, snap, req.rid, off, length)

    def _get(self, ident: bytes, req: wire.GetChunk, peer: str) -> None:
        snap = self._shelf.get(req.sid) or self._public.by_sid(req.sid) or next(
            (r for r in self._relayed.values() if r.manifest.sid == req.sid), None)
        if snap is None:
            latest = self._latest
            self._error(ident, req.rid, "gone", f"snapshot {req.sid} is no longer served"
                        + (f"; the latest is version {latest.manifest.version}" if latest else ""), peer)
            return
        m, end = snap.manifest, req.offset + req.length
        if req.offset % m.block or end > m.total or (req.length % m.block and end != m.total):
            self._error(ident, req.rid, "bad_request", f"range [{req.offset}, {end}) is not whole blocks of "
                        f"{m.block} within {m.total} bytes", peer)
            return
        self._chunk(ident, snap, req.rid, req.offset, req.length)

    def _chunk(self, ident: bytes, snap: Published, rid: int, off: int, length: int) -> None:
        with self._lock:
            self._stats["chunks_served"] += 1
            self._stats["payload_bytes_sent"] += length
        self._reply(ident, wire.ChunkReply(rid=rid, sid=snap.manifest.sid, offset=off, length=length,
                                           payload=snap.view[off : off + length]))
