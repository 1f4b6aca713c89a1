"""HELLOs held until the server publishes the version they want (protocol 1.1, `hello.want`).

An island that waits for its partner to finish a round used to ask for the partner's manifest
again and again until the new version appeared: a round trip and a manifest per poll, bytes the
exchange paid for nothing. A HELLO with `want` instead stays with the server until that version is
published or `wait_ms` passes, and is then answered as usual (manifest and prefetch), so waiting
costs no more than the one HELLO the fetch sends anyway, and the answer leaves the moment the
version exists rather than up to a poll interval later.

Held requests are bounded: one per connection (a newer HELLO answers the older one at once) and
`MAX_PARKED` in all (past that a HELLO is answered at once, as a 1.0 server would).
"""

from __future__ import annotations

from collections.abc import Callable

from p2p_diloco.exchange import wire

MAX_PARKED = 256
"""HELLOs a server holds at once; more are answered without waiting."""


class ParkedHellos:
    """The HELLOs a server holds, by connection (used on the server's socket thread only)."""

    def __init__(self) -> None:
        self._held: dict[bytes, tuple[wire.Hello, str, float]] = {}
        self.final = False
        """The server publishes nothing newer (its island is leaving): no HELLO waits any more (set by
        any thread)."""

    def __len__(self) -> int:
        return len(self._held)

    def park(self, ident: bytes, req: wire.Hello, peer: str, now: float) -> list[tuple[bytes, wire.Hello, str]]:
        """Hold `req` until `now + wait_ms`; returns the HELLOs to answer at once: `req` itself when
        no more can be held or nothing newer comes, the connection's older one when it had one, else none."""
        if self.final or (len(self._held) >= MAX_PARKED and ident not in self._held):
            return [(ident, req, peer)]
        older = self._held.pop(ident, None)
        self._held[ident] = (req, peer, now + req.wait_ms / 1000)
        return [] if older is None else [(ident, older[0], older[1])]

    def due(self, published: Callable[[wire.Hello], int], now: float) -> list[tuple[bytes, wire.Hello, str]]:
        """Take the HELLOs whose version is published (`published(hello)` is the version that
        hello would be answered with) or whose wait is over (all of them once nothing newer comes)."""
        out = [(ident, req, peer) for ident, (req, peer, until) in self._held.items()
               if now >= until or self.final or published(req) >= req.want]
        for ident, _, _ in out:
            del self._held[ident]
        return out
