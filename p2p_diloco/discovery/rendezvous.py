"""The bootstrap node's rendezvous: the ZeroMQ fallback's well-known meeting point.

Islands that cannot use the DHT register and heartbeat here (`peer_exchange.ZmqMembership`
syncs with it every `poll` seconds); it keeps one `MemberTable` of signed entries per run and
answers every sync with the table. It decides nothing and stores no training state: islands
keep meeting each other through peer exchange without it. It holds no swarm secret: a sealed run's
entries are kept and served as they are (signatures and shapes checked), never read.

It also answers `dialback`: it connects back to an island's endpoint to tell it whether others can
reach it (`reachability`). Probes run on a small pool; this socket stays with the serving thread,
which sends their replies as they finish.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from p2p_diloco.discovery.entries import MemberTable, answer_sync
from p2p_diloco.discovery.reachability import Dialbacks
from p2p_diloco.discovery.records import PEER_ID_RE
from p2p_diloco.discovery.router import Origin, answer_one, bind_router, send_reply
from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

MAX_RUNS = 256
"""Runs one rendezvous keeps tables for; more are refused (bounded memory on the bootstrap node)."""
PRUNE_EVERY_S = 1.0
"""How often expired entries are dropped (and logged as expired)."""
POLL_MS = 200
"""Longest the serving thread waits for a request before it checks for a stop and a prune."""
DIALBACK_POLL_MS = 20
"""... and while dial-back probes run, before it sends the replies of those that finished."""


class RendezvousServer:
    """The bootstrap node's ROUTER socket: keeps one `MemberTable` per run and answers syncs and
    dial-backs (whose replies name `relay`, the bootstrap node's relay endpoint, when it runs one)."""

    def __init__(self, host: str, port: int, node_id: str, relay: str | None = None) -> None:
        self.node_id = node_id
        self._dialbacks = Dialbacks(relay)
        self._ctx = zmq.Context()
        try:
            self._sock, self.address, self.port = bind_router(self._ctx, host, port, "the rendezvous")
        except DiscoveryError:
            self._ctx.term()
            raise
        self.tables: dict[str, MemberTable] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rendezvous", daemon=True)

    def start(self) -> RendezvousServer:
        self._thread.start()
        return self

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_prune = time.monotonic()
        while not self._stop.is_set():
            if poller.poll(DIALBACK_POLL_MS if self._dialbacks.pending else POLL_MS):
                self.serve_one()
            for ident, reply in self._dialbacks.finished():
                send_reply(self._sock, ident, reply, "rendezvous")
            if time.monotonic() - last_prune > PRUNE_EVERY_S:
                self._prune()
                last_prune = time.monotonic()
        self._dialbacks.close()
        self._sock.close()
        self._ctx.term()

    def serve_one(self) -> None:
        answer_one(self._sock, self._answer, "rendezvous")

    def _answer(self, msg: dict, origin: Origin) -> bytes | None:
        """A sync of any run this node keeps a table for (a new run gets one, up to `MAX_RUNS`), or a
        dial-back (answered now when busy, else when its probe finishes)."""
        if msg["type"] == "dialback":
            return self._dialbacks.answer(msg, origin)
        if msg["type"] != "sync":
            raise ValueError(f"unknown message type {msg['type'][:32]!r}")
        run = msg.get("run")
        if not (isinstance(run, str) and PEER_ID_RE.match(run)):
            raise ValueError("sync needs a run id of 1-64 characters [A-Za-z0-9_-]")
        table = self.tables.get(run)
        if table is None:
            if len(self.tables) >= MAX_RUNS:
                raise ValueError(f"this rendezvous already serves {MAX_RUNS} runs")
            table = self.tables[run] = MemberTable(run)
        before = table.present(time.time())
        reply, changed = answer_sync(table, msg, self.node_id)
        for pid in sorted(table.present(time.time()) - before):
            record = table.entries[pid].record
            logger.info("rendezvous: island %s joined run %r at %s", pid, run,
                        record.endpoint if record is not None else "a sealed address")
        for e in changed:
            if e.is_tombstone:
                logger.info("rendezvous: island %s left run %r", e.peer_id, e.run_id)
        return reply

    def _prune(self) -> None:
        now = time.time()
        for run, table in list(self.tables.items()):
            for e in table.prune(now):
                if not e.is_tombstone:
                    logger.info("rendezvous: island %s of run %r expired", e.peer_id, run)
            if not table.entries:
                del self.tables[run]

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif not self._sock.closed:
            self._dialbacks.close()
            self._sock.close()
            self._ctx.term()
