"""The ZeroMQ discovery fallback: an island's membership through rendezvous and peer exchange.

`ZmqMembership` implements `Membership` without libp2p. A background thread owns all its sockets:

- a ROUTER (the island's peer-exchange endpoint, `px`, on `DiscoveryConfig.px_port`) that answers
  sync requests from other islands exactly like the bootstrap's rendezvous does, so any island can
  serve as an entry point. An outbound-only island (`outbound_only`) binds none and announces no
  `px`: nobody could dial it, so nobody should try;
- one DEALER per contacted endpoint. Every `poll` seconds it syncs with the bootstrap
  rendezvous(es) and `FANOUT` random known islands: it sends its whole table of signed entries and
  merges the table it gets back. A dead bootstrap is retried every `refresh` seconds, and because
  islands sync with each other, they keep seeing each other without it.

The own entry is re-signed every `refresh` seconds with an expiry `expiry` seconds ahead (and, with
a swarm secret, sealed: `entries`, `sealing`); a clean leave pushes a signed tombstone to every
known endpoint at once. Like `rendezvous`, this module opens its own small sockets because
discovery has to work before, and without, the state exchange.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import zmq

from p2p_diloco import addresses
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery.entries import (
    MAX_MESSAGE_BYTES, Entry, MemberTable, SigningKey, answer_sync, decode, encode, pick_entries
)
from p2p_diloco.discovery.membership import BackgroundMembership
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.discovery.sealing import RecordSeal
from p2p_diloco.discovery.router import SOCKET_SLACK_BYTES, Origin, answer_one, bind_router
from p2p_diloco.errors import BootstrapUnanswered, DiscoveryError

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT = 1.0
"""Seconds to wait for one sync reply before the endpoint counts as unreachable this round."""
FANOUT = 2
"""Random known islands contacted per sync round (besides the bootstrap rendezvous)."""
IDLE_WAIT = 0.1
"""Longest the thread sleeps between checks for announce/leave requests."""


class ZmqMembership(BackgroundMembership):
    """The membership of one run over ZeroMQ (see the module docstring)."""

    kind = "zmq"
    _join_timeout = REQUEST_TIMEOUT + 5.0
    _leave_timeout = REQUEST_TIMEOUT + 2.0

    def __init__(self, config: DiscoveryConfig, *, observer: bool = False) -> None:
        super().__init__(config, observer)
        self._key = SigningKey()
        self._bootstraps = addresses.rendezvous_endpoints(config.bootstrap)
        if observer and not self._bootstraps:
            raise DiscoveryError("watching a run needs at least one bootstrap address")
        self._seal = RecordSeal(config.secret, config.run_id, self.kind, observer)
        self._table = MemberTable(config.run_id, self._seal)
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()
        self._dealers: dict[str, zmq.Socket] = {}
        self._router: zmq.Socket | None = None
        self.px: str | None = None
        if not (observer or config.outbound_only):  # an outbound-only island serves nobody: others cannot dial it
            try:
                self._router, _, port = bind_router(self._ctx, config.host, config.px_port, "peer exchange")
            except DiscoveryError:
                self._ctx.term()
                raise
            vis = config.visible_host
            self.px = f"tcp://{f'[{vis}]' if ':' in vis else vis}:{port}"
            self._poller.register(self._router, zmq.POLLIN)
        self.bootstrap_nodes: dict[str, str] = {}
        """Rendezvous endpoint -> node id that answered there (the bootstrap's peer id)."""
        self._ready = threading.Event()
        self._sync_requested = self._joined = False
        self._start("zmq-membership")
        self._ready.wait()
        if self._bootstraps and not self._joined:
            self.shutdown()
            raise BootstrapUnanswered(
                f"no rendezvous answered within {config.connect_timeout:g} s (tried {', '.join(self._bootstraps)})"
            )
        logger.info("joined run %r over ZeroMQ as %s (px %s, observer=%s)", config.run_id, self.peer_id, self.px, observer)

    @property
    def peer_id(self) -> str:
        return self._key.peer_id

    def _live_records(self) -> dict[str, IslandRecord]:
        return self._table.records(time.time())

    def sealed_hidden(self) -> int:
        with self._lock:
            return self._table.hidden(time.time())

    def refused_records(self) -> int:
        return self._seal.refused

    def _announced(self, first: bool) -> None:
        self._sync_requested |= first  # spread a new member's entry at once

    def _request_poll(self) -> int:
        self._sync_requested = True
        return 1

    # -- background thread: owns every socket -------------------------------------------------

    def _run(self) -> None:
        try:
            self._join()
            self._loop()
        finally:
            self._ready.set()
            for sock in [*self._dealers.values(), *([self._router] if self._router is not None else [])]:
                sock.close(linger=0)
            self._ctx.term()

    def _join(self) -> None:
        deadline = time.monotonic() + self.config.connect_timeout
        while self._bootstraps and not self._stop.is_set() and time.monotonic() < deadline:
            if self._sync(self._bootstraps, timeout=min(REQUEST_TIMEOUT, deadline - time.monotonic())):
                self._joined = True
                break
        self._ready.set()

    def _loop(self) -> None:
        cfg = self.config
        last_sign = last_sync = float("-inf")
        retry_at = {ep: 0.0 for ep in self._bootstraps}
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                record, dirty, leave, wanted = self._record, self._dirty, self._leave_requested, self._sync_requested
            if leave:
                self._put(Entry.make(self._key, cfg.run_id, self.px, time.time() + cfg.expiry, None))
                self._sync(self._bootstraps + self._peers(None))
                with self._lock:
                    self._left, self._leave_requested = True, False
                self._left_event.set()
                logger.info("left run %r (tombstone sent)", cfg.run_id)
                continue
            if record is not None and not self._left and (dirty or now - last_sign >= cfg.refresh):
                with self._lock:
                    self._dirty = False
                self._put(Entry.make(self._key, cfg.run_id, self.px, time.time() + cfg.expiry, record, self._seal))
                last_sign = now
            if wanted or now - last_sync >= cfg.poll:
                due = [ep for ep in self._bootstraps if now >= retry_at[ep]]
                answered = self._sync(due + self._peers(FANOUT))
                for ep in due:
                    retry_at[ep] = 0.0 if ep in answered else now + cfg.refresh
                last_sync = time.monotonic()
                with self._lock:
                    self._sync_requested = False
                    self._table.prune(time.time())
                    self._polls += 1
                    self._poll_done.notify_all()
                self._log_view()
                keep = set(self._bootstraps) | set(self._peers(None))
                for ep in [ep for ep in self._dealers if ep not in keep]:
                    self._drop_dealer(ep)  # an island that left: stop redialling it
            self._serve_for(IDLE_WAIT)

    def _put(self, entry: Entry) -> None:
        with self._lock:
            self._table.put(entry)

    def _peers(self, k: int | None) -> list[str]:
        """Peer-exchange endpoints of known live islands: all of them, or `k` at random."""
        with self._lock:
            eps = sorted({e.px for e in self._table.live(time.time())
                          if e.px and e.peer_id != self.peer_id and e.record is not None} - set(self._bootstraps))
        return eps if k is None or len(eps) <= k else random.sample(eps, k)

    def _dealer(self, ep: str) -> zmq.Socket:
        sock = self._dealers.get(ep)
        if sock is None:
            sock = self._dealers[ep] = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + SOCKET_SLACK_BYTES)
            sock.setsockopt(zmq.SNDHWM, 4)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)  # back off while an endpoint is down
            sock.connect(ep)
            self._poller.register(sock, zmq.POLLIN)
        return sock

    def _drop_dealer(self, ep: str) -> None:
        sock = self._dealers.pop(ep, None)
        if sock is not None:
            self._poller.unregister(sock)
            sock.close(linger=0)  # its queued request and any late reply go with it

    def _sync(self, targets: list[str], timeout: float = REQUEST_TIMEOUT) -> set[str]:
        """One request/reply with each target, serving incoming requests meanwhile; returns who answered."""
        with self._lock:
            entries = [] if self.observer else pick_entries(self._table.live(time.time()), first=self.peer_id)
        request = encode({"type": "sync", "run": self.config.run_id, "entries": entries})
        pending: dict[zmq.Socket, str] = {}
        for ep in dict.fromkeys(targets):
            sock = self._dealer(ep)
            try:
                sock.send(request, zmq.NOBLOCK)
                pending[sock] = ep
            except zmq.ZMQError:
                self._drop_dealer(ep)
        answered: set[str] = set()
        deadline = time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            for sock, _ in self._poller.poll(left * 1000):
                if sock is self._router:
                    self._serve_one()
                elif sock in pending:
                    ep = pending.pop(sock)
                    if self._take_reply(ep, sock.recv()):
                        answered.add(ep)
        for ep in pending.values():
            self._drop_dealer(ep)
        return answered

    def _take_reply(self, ep: str, data: bytes) -> bool:
        try:
            msg = decode(data)
            if msg["type"] == "error":
                raise ValueError(f"it refused our request: {str(msg.get('reason'))[:200]}")
            if msg["type"] != "sync" or msg.get("run") != self.config.run_id or not isinstance(msg.get("entries"), list):
                raise ValueError("reply is not a sync of this run")
        except ValueError as e:
            logger.info("bad reply from %s: %s", ep, e)
            return False
        with self._lock:
            _, refused = self._table.merge(msg["entries"], time.time())
        if refused:
            logger.info("%s sent %d entries we refused, first because: %s", ep, len(refused), refused[0])
        if ep in self._bootstraps and isinstance(msg.get("node"), str):
            self.bootstrap_nodes[ep] = msg["node"][:128]
        return True

    def _serve_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
            if self._router is None:
                time.sleep(min(left, 0.02))
                with self._lock:
                    if self._sync_requested or self._leave_requested:
                        return
                continue
            for sock, _ in self._poller.poll(min(left, 0.02) * 1000):
                if sock is self._router:
                    self._serve_one()
                else:  # a late reply: drop that socket, a fresh one serves the next request
                    for ep in [ep for ep, s in self._dealers.items() if s is sock]:
                        self._drop_dealer(ep)
            with self._lock:
                if self._sync_requested or self._leave_requested or self._dirty:
                    return

    def _serve_one(self) -> None:
        answer_one(self._router, self._answer, "peer exchange")

    def _answer(self, msg: dict, _origin: Origin) -> bytes:
        """A sync of this island's run, answered like the rendezvous does."""
        if msg["type"] != "sync" or msg.get("run") != self.config.run_id:
            raise ValueError(f"expected a sync of run {self.config.run_id!r}")
        with self._lock:
            reply, _ = answer_sync(self._table, msg, self.peer_id)
        return reply
