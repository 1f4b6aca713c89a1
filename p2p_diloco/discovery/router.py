"""The one ROUTER request loop of the ZeroMQ discovery fallback.

The bootstrap node's rendezvous and every island's peer-exchange socket answer the same requests
the same way: take one message, refuse anything that is not a single frame of a valid message
with a reply that says why (and a log line), let the caller build the reply of a good one, and
send it without ever blocking the thread that serves. A caller that needs time (the rendezvous's
`dialback`) answers later, from the same thread, with `send_reply`. `bind_router` makes such a socket.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from p2p_diloco.discovery.entries import MAX_MESSAGE_BYTES, decode, encode
from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

SOCKET_SLACK_BYTES = 1024
"""A socket admits messages this much over `MAX_MESSAGE_BYTES`, so an oversized one is refused by
`decode` with a reason rather than dropped silently by ZeroMQ."""


def bind_router(ctx: zmq.Context, host: str, port: int, what: str) -> tuple[zmq.Socket, str, int]:
    """A bounded ROUTER socket listening on host:port (0: any free port): (socket, bind address,
    port). `DiscoveryError` naming `what` when it cannot listen."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + SOCKET_SLACK_BYTES)
    bind_host = f"[{host}]" if ":" in host else host
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    try:
        if port == 0:
            port = sock.bind_to_random_port(f"tcp://{bind_host}")
        else:
            sock.bind(f"tcp://{bind_host}:{port}")
    except zmq.ZMQError as e:
        sock.close()
        raise DiscoveryError(f"cannot listen on tcp://{bind_host}:{port} for {what}: {e}") from e
    return sock, f"tcp://{bind_host}:{port}", port


@dataclass(frozen=True)
class Origin:
    """Who sent a request: its routing id (to answer it) and the address it came from."""

    ident: bytes
    address: str | None
    """The sender's IP address as this socket sees it (ZeroMQ's `Peer-Address`; None if unknown)."""


Handler = Callable[[dict[str, Any], Origin], "bytes | None"]


def answer_one(sock: zmq.Socket, handle: Handler, where: str) -> None:
    """Serve one request waiting on `sock`, if any.

    `handle` gets the decoded message and its `Origin`, and returns the encoded reply, or None when
    it answers later itself (`send_reply`), or raises `ValueError` naming what is wrong with the
    request; that, a malformed message and a message of several frames are answered with an error
    (or dropped, for frames) and logged with `where`.
    """
    try:
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
    except zmq.ZMQError:
        return
    if len(frames) != 2:
        logger.info("%s: dropped a message of %d frames (expected 1 after the routing id)", where, len(frames) - 1)
        return
    ident, payload = frames
    try:
        address = payload.get("Peer-Address")
    except zmq.ZMQError:
        address = None
    try:
        reply = handle(decode(payload.bytes), Origin(ident.bytes, address or None))
    except ValueError as e:
        logger.info("%s: refused a request: %s", where, e)
        reply = encode({"type": "error", "reason": str(e)[:300]})
    if reply is not None:
        send_reply(sock, ident.bytes, reply, where)


def send_reply(sock: zmq.Socket, ident: bytes, reply: bytes, where: str) -> None:
    """Send `reply` to the peer with routing id `ident` without blocking (logged if it cannot)."""
    try:
        sock.send_multipart([ident, reply], zmq.NOBLOCK)
    except zmq.ZMQError as e:
        logger.info("%s: could not answer a peer: %s", where, e)
