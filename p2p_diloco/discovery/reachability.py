"""Can others dial this island? A dial-back through the bootstrap node's rendezvous.

An island behind NAT or a firewall can fetch from others while nobody can fetch from it. At join
it asks a rendezvous to connect back to its state-exchange endpoint (`check_reachable`); the
rendezvous (`Dialbacks`, served by `rendezvous.RendezvousServer`) opens a TCP connection there and
reads the ZMTP greeting a ZeroMQ socket sends at once on accept (`probe`). The probe sends nothing,
so it works against a CurveZMQ server without the swarm secret, and learns nothing but whether a
ZeroMQ socket listens there. The island then runs `direct` or outbound-only, and `unreachable_message`
tells its owner what to open.

```
request  {"v": 1, "type": "dialback", "run": RUN_ID, "endpoint": "tcp://host:port"}
reply    {"v": 1, "type": "dialback", "reachable": bool | None, "reason": str | None,
          "seen_from": the request's source address | None, "relay": RELAY_ENDPOINT | None}
```

`reachable` is None when the rendezvous could not check (busy: at most one dial-back per source
address every `RATE_WINDOW_S`, `MAX_IN_FLIGHT` probes at a time). Plain pyzmq and the standard
library: no sockets of the state exchange.
"""

from __future__ import annotations

import errno
import logging
import queue
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from p2p_diloco import addresses
from p2p_diloco.config import DHT_PORT_OFFSET, PX_PORT_OFFSET
from p2p_diloco.discovery.entries import MAX_MESSAGE_BYTES, decode, encode
from p2p_diloco.discovery.records import ENDPOINT_RE, MAX_ENDPOINT_LEN, PEER_ID_RE
from p2p_diloco.discovery.router import SOCKET_SLACK_BYTES, Origin

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
"""How long the rendezvous waits for a connection and a greeting at the dialled endpoint."""
ASK_TIMEOUT_S = PROBE_TIMEOUT_S + 3.0
"""How long an island waits for one rendezvous's answer (the probe plus a round trip)."""
RATE_WINDOW_S = 2.0
"""At most one dial-back per source address this often."""
MAX_IN_FLIGHT = 4
"""Probes a rendezvous runs at a time; more are answered `busy`."""
BUSY = "busy, try again"
ZMTP_SIGNATURE_BYTES = 10
"""A ZeroMQ socket's greeting opens with 0xFF, 8 bytes, 0x7F (ZMTP 3.x, RFC 23)."""
_WILDCARDS = {"*", "0.0.0.0", "::"}


@dataclass(frozen=True)
class Dialback:
    """What a rendezvous found when it dialled an island's endpoint."""

    reachable: bool | None
    """True: a ZeroMQ socket answered there; False: it did not; None: could not be checked."""
    reason: str | None = None
    """Why not (refused, timed out, ...), or why it could not be checked."""
    seen_from: str | None = None
    """The island's address as the rendezvous saw it (its public address behind NAT)."""
    relay: str | None = None
    """The bootstrap node's relay endpoint, when it runs one."""


def target(endpoint: Any) -> tuple[str, int]:
    """(host, port) of a `tcp://host:port` endpoint a dial-back may dial; `ValueError` naming the
    problem for anything else (another transport, no port, a wildcard host, too long)."""
    if not (isinstance(endpoint, str) and len(endpoint) <= MAX_ENDPOINT_LEN and ENDPOINT_RE.match(endpoint)):
        raise ValueError(f"endpoint must be tcp://host:port, got {str(endpoint)[:80]!r}")
    try:
        a = addresses.parse(endpoint)
    except ValueError as e:
        raise ValueError(f"endpoint must be tcp://host:port: {e}") from None
    if a.host in _WILDCARDS:
        raise ValueError(f"endpoint {endpoint!r} names a wildcard address, which nobody can dial")
    return a.host, a.port


def probe(endpoint: str, timeout: float) -> str | None:
    """None when a ZeroMQ socket accepts a TCP connection at `endpoint` (`tcp://host:port`) and
    greets within `timeout` seconds, else a short reason. Sends nothing; `ValueError` for a
    malformed endpoint."""
    host, port = target(endpoint)
    deadline = time.monotonic() + timeout
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror or e}"
    except OSError as e:
        return _os_reason(e, timeout)
    got = b""
    with conn:
        try:
            while len(got) < ZMTP_SIGNATURE_BYTES:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = conn.recv(ZMTP_SIGNATURE_BYTES - len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:  # silence or a reset: judged by what arrived
            pass
    if len(got) == ZMTP_SIGNATURE_BYTES and got[0] == 0xFF and got[-1] == 0x7F:
        return None
    if not got:
        return f"something accepted the connection but sent no ZeroMQ greeting within {timeout:g} s"
    return "something answered but it is not a ZeroMQ socket"


def _os_reason(e: OSError, timeout: float) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)) or e.errno == errno.ETIMEDOUT:
        return f"timed out after {timeout:g} s"
    known = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "no route to host",
             errno.ENETUNREACH: "network unreachable", errno.ECONNRESET: "connection reset"}
    return known.get(e.errno) or (e.strerror or str(e) or type(e).__name__).lower()


class Dialbacks:
    """The rendezvous's side of dial-backs: checks each request, rate-limits it, probes on a small
    pool of threads. Only the rendezvous's serving thread calls it: `answer` takes a request,
    `finished` hands back the replies of probes done since, for that thread to send."""

    def __init__(self, relay: str | None = None, probe_timeout: float = PROBE_TIMEOUT_S) -> None:
        if relay is not None:
            target(relay)
        self.relay = relay
        self.probe_timeout = probe_timeout
        self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="dialback")
        self._last: dict[str | None, float] = {}
        self._running: set[Future] = set()
        self._done: queue.SimpleQueue[tuple[Origin, str, Future]] = queue.SimpleQueue()

    @property
    def pending(self) -> int:
        """Probes still running (their replies are not sent yet)."""
        return len(self._running)

    def answer(self, msg: dict[str, Any], origin: Origin) -> bytes | None:
        """The reply to a `dialback` request now (busy), or None when a probe will answer it; `ValueError`
        for a malformed request."""
        if set(msg) != {"v", "type", "run", "endpoint"}:
            raise ValueError("dialback takes exactly v, type, run and endpoint")
        if not (isinstance(msg["run"], str) and PEER_ID_RE.match(msg["run"])):
            raise ValueError("dialback needs a run id of 1-64 characters [A-Za-z0-9_-]")
        endpoint = msg["endpoint"]
        target(endpoint)
        now = time.monotonic()
        self._last = {a: t for a, t in self._last.items() if now - t < RATE_WINDOW_S}
        if origin.address in self._last or len(self._running) >= MAX_IN_FLIGHT:
            return self.reply(None, BUSY, origin.address)
        self._last[origin.address] = now
        future = self._pool.submit(probe, endpoint, self.probe_timeout)
        self._running.add(future)
        future.add_done_callback(lambda f: self._done.put((origin, endpoint, f)))
        return None

    def finished(self) -> list[tuple[bytes, bytes]]:
        """(routing id, reply) of every probe that finished since the last call."""
        out = []
        while not self._done.empty():
            origin, endpoint, future = self._done.get()
            self._running.discard(future)
            try:
                reason = future.result()
                reply = self.reply(reason is None, reason, origin.address)
            except Exception as e:  # a probe that crashed (or was cancelled at close): not checked
                reason = f"the check failed: {type(e).__name__}"
                reply = self.reply(None, reason, origin.address)
            logger.info("dialback to %s for %s: %s", endpoint, origin.address, reason or "reachable")
            out.append((origin.ident, reply))
        return out

    def reply(self, reachable: bool | None, reason: str | None, seen_from: str | None) -> bytes:
        if seen_from is not None and seen_from.startswith("::ffff:") and "." in seen_from:
            seen_from = seen_from.removeprefix("::ffff:")  # an IPv4 peer on a dual-stack socket
        return encode({"type": "dialback", "reachable": reachable, "reason": reason, "seen_from": seen_from,
                       "relay": self.relay})

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def rendezvous_addresses(bootstrap: tuple[str, ...] | list[str]) -> list[str]:
    """The rendezvous endpoints the bootstrap addresses stand for, as the ZeroMQ fallback derives them
    (`addresses.rendezvous_endpoints`: tcp:// as given, a multiaddr's port + 1)."""
    return addresses.rendezvous_endpoints(bootstrap)


def ask_dialback(rendezvous: str, endpoint: str, run_id: str, timeout: float = ASK_TIMEOUT_S) -> Dialback:
    """Ask the rendezvous at `rendezvous` to dial `endpoint`; waits at most `timeout` seconds. Never
    raises for a network problem: the `Dialback` then says it could not check, and why."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + SOCKET_SLACK_BYTES)
        sock.setsockopt(zmq.IPV6, int("[" in rendezvous))
        sock.connect(rendezvous)
        sock.send(encode({"type": "dialback", "run": run_id, "endpoint": endpoint}), zmq.NOBLOCK)
        if not sock.poll(timeout * 1000):
            return Dialback(None, f"{rendezvous} did not answer within {timeout:g} s")
        return _read_reply(sock.recv(), rendezvous)
    except zmq.ZMQError as e:
        return Dialback(None, f"cannot ask {rendezvous}: {e}")
    finally:
        sock.close(linger=0)
        ctx.term()


def _read_reply(data: bytes, rendezvous: str) -> Dialback:
    try:
        msg = decode(data)
    except ValueError as e:
        return Dialback(None, f"{rendezvous} sent a malformed reply: {e}")
    if msg["type"] == "error":
        return Dialback(None, f"{rendezvous} refused the check: {str(msg.get('reason'))[:200]}")
    reachable, reason = msg.get("reachable"), msg.get("reason")
    if msg["type"] != "dialback" or not (reachable is None or isinstance(reachable, bool)):
        return Dialback(None, f"{rendezvous} sent a reply that is not a dialback")
    seen, relay = msg.get("seen_from"), msg.get("relay")
    return Dialback(reachable, str(reason)[:200] if reason is not None else None,
                    seen[:64] if isinstance(seen, str) and seen else None,
                    relay if isinstance(relay, str) and len(relay) <= MAX_ENDPOINT_LEN and ENDPOINT_RE.match(relay) else None)


def check_reachable(bootstrap: tuple[str, ...] | list[str], endpoint: str, run_id: str,
                    timeout: float = ASK_TIMEOUT_S) -> Dialback:
    """Ask each rendezvous of the bootstrap addresses in turn (at most `timeout` seconds each, a busy
    one once more after `RATE_WINDOW_S`) until one checks `endpoint`; else the last answer, which
    says why it could not be checked."""
    try:
        target(endpoint)
    except ValueError as e:
        return Dialback(None, str(e))
    result = Dialback(None, "no bootstrap address to ask")
    for rendezvous in rendezvous_addresses(bootstrap):
        result = ask_dialback(rendezvous, endpoint, run_id, timeout)
        if result.reachable is None and result.reason == BUSY:
            time.sleep(RATE_WINDOW_S)
            result = ask_dialback(rendezvous, endpoint, run_id, timeout)
        if result.reachable is not None:
            return result
    return result


def unreachable_message(endpoint: str, dialback: Dialback, port: int, dht_port: int | None = None) -> str:
    """One line for the island's owner when `dialback` found `endpoint` unreachable (or could not
    check it): why, and which ports to forward (`join --port PORT`: PORT, the DHT's and PORT + 2)."""
    if port:
        ports = [port, dht_port or port + DHT_PORT_OFFSET, port + PX_PORT_OFFSET]
        ports_text = (f"TCP ports {port}-{port + PX_PORT_OFFSET}" if ports[1] == port + DHT_PORT_OFFSET
                      else f"TCP ports {ports[0]}, {ports[1]} and {ports[2]}")
        forward = f"forward {ports_text} to this machine on your router and firewall"
    else:
        forward = ("pass --port P (the island then listens on P to P+2) and forward those TCP ports to this "
                   "machine on your router and firewall")
    seen = dialback.seen_from
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if seen and seen != host:
        forward += f", and pass --announce {seen} (your address as the bootstrap node sees it)"
    else:
        forward += ", or pass --announce with an address others can reach"
    if dialback.reachable is None:
        return (f"could not check whether others can reach {endpoint} ({dialback.reason or 'no reason given'}); "
                f"assuming they can. If they cannot, {forward}, or pass --reach outbound.")
    where = f"; it sees you as {seen}" if seen else ""
    return (f"not reachable from outside: the bootstrap node could not connect to {endpoint} "
            f"({dialback.reason or 'no reason given'}{where}). {forward[0].upper()}{forward[1:]}; until then this "
            "island runs outbound-only: it fetches from reachable islands and pushes its state to them.")
