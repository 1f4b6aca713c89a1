"""ZeroMQ plumbing shared by the snapshot server and the fetcher.

The process's context for fetch sockets, the CurveZMQ key pairs derived from the swarm secret, the
ZAP check that admits only the derived client key, and a rate limit on rejection logs (a flood of
bad requests must not become a flood of log lines).

Keys: `scrypt(secret, salt="p2p-diloco swarm keys v1", N=2^14, r=8, p=1)` gives 64 bytes; the
first 32 are the server's Curve25519 secret key, the last 32 the client's. Every member derives the
same keys, so the secret proves membership of the swarm (which is the trust model), and scrypt
makes each guess at a weak passphrase cost about 16 MiB and tens of milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85

ZAP_DOMAIN = "p2p-diloco"
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_client_ctx: tuple[int, zmq.Context] | None = None
_ctx_lock = threading.Lock()


def client_context() -> zmq.Context:
    """The process's shared context for fetch sockets (recreated after a fork)."""
    global _client_ctx
    with _ctx_lock:
        if _client_ctx is None or _client_ctx[0] != os.getpid():
            _client_ctx = (os.getpid(), zmq.Context(io_threads=1))
        return _client_ctx[1]


@dataclass(frozen=True)
class SwarmKeys:
    """Z85-encoded CurveZMQ key pairs of the two roles."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


@functools.lru_cache(maxsize=8)
def swarm_keys(secret: str) -> SwarmKeys:
    """CurveZMQ key pairs derived from the swarm secret (same secret, same keys, on every peer)."""
    seed = hashlib.scrypt(secret.encode(), salt=b"p2p-diloco swarm keys v1", n=2**14, r=8, p=1, dklen=64)
    server_secret, client_secret = z85.encode(seed[:32]), z85.encode(seed[32:])
    return SwarmKeys(server_public=zmq.curve_public(server_secret), server_secret=server_secret,
                     client_public=zmq.curve_public(client_secret), client_secret=client_secret)


def tcp_bind_address(bind: str) -> str:
    """`tcp://host:0` means an OS-chosen port (ZeroMQ spells it `*`)."""
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


class RateLimitedLog:
    """Logs the first occurrence of each reason, then at most once per `period` with a count."""

    def __init__(self, logger: logging.Logger, period: float = 5.0) -> None:
        self._log, self._period = logger, period
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, reason: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        last, skipped = self._last.get(reason, (-math.inf, 0))
        if now - last >= self._period:
            suffix = f" ({skipped} more like it suppressed)" if skipped else ""
            self._log.warning(message + suffix, *args)
            self._last[reason] = (now, 0)
        else:
            self._last[reason] = (last, skipped + 1)


class AllowClientKey:
    """ZAP credentials provider: admits exactly the client key derived from the swarm secret."""

    def __init__(self, client_public: bytes, on_refuse: Callable[[str], None]) -> None:
        self._key, self._on_refuse = client_public, on_refuse

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self._key
        if not ok:
            self._on_refuse("client key not derived from the swarm secret")
        return ok
