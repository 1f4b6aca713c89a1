"""Pushed snapshots, the server's side: a client that nobody can dial delivers its state over the
connection it opened (protocol 1.1, docs/PROTOCOL.md section 5.1).

An island behind a NAT or a firewall can fetch from others, but no one can fetch from it; so when
it fetches from a reachable partner it offers its own snapshot on the same connection (`push`), and
the partner takes it in at the pace it grants (`grant`), checking every block as it arrives exactly
as a fetcher does (digests, sizes, finite values: `payload.Assembler`). Only a whole, checked state
is handed over (`stored`); anything else costs only that push.

`PushReceiver` is socket-free bookkeeping driven by `SnapshotServer`'s thread: who may push (an
island takes a push only from a connection that fetched from it in the last minute, and then only
what its `PushPolicy` admits; a relay takes any member's), the grants that pace the sender, the
assembly, and the hand-over to the policy. The sending side is `Fetcher.push` (`client.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from p2p_diloco.errors import BadPayload
from p2p_diloco.exchange import wire
from p2p_diloco.exchange.payload import Assembler, Published

RELAY_MAX_PEERS = 64
"""A relay keeps the latest pushed state of at most this many peers (the least recently pushed goes)."""

GRANT_WINDOW = 8 * wire.MiB
"""Bytes a pusher may have on its way beyond what arrived (about 2 x bandwidth x RTT for 100 Mbit/s
at 300 ms): the receiver paces the sender with grants, as a fetcher paces a server with requests."""
HELLO_VALID_S = 60.0
"""An island takes a push only on a connection that asked for its manifest this recently: the
exchange is one the pusher opened to fetch, never an unsolicited delivery."""
STALL_S = 60.0
"""A push with no PUT for this long is dropped (its sender died or stalled)."""
MAX_INCOMING = 2
"""Pushes assembled at once (each holds one encoded copy of a state until it is handed over)."""


class PushRefused(Exception):
    """A push is not taken: `code` (a protocol error code) and a reason for the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Pushed:
    """A pushed snapshot that arrived whole and checked: encoded tensors over its payload bytes."""

    manifest: wire.Manifest
    tensors: dict[str, Any]  # codecs.EncodedVector per tensor, views of `raw`
    raw: torch.Tensor  # the payload bytes, as published (a relay serves them again as they are)
    address: str  # the pusher's address as the socket saw it
    seconds: float

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.manifest.meta)


@dataclass
class _Incoming:
    rid: int
    asm: Assembler
    granted: int
    last_put: float
    started: float
    address: str


class PushPolicy(Protocol):
    """What a server does with pushes (called on the server's thread)."""

    def admit(self, manifest: wire.Manifest) -> tuple[str, str] | None:
        """Before any byte flows: None to take the push, else (error code, reason)."""

    def stored(self, pushed: Pushed) -> None:
        """An admitted push arrived whole and checked."""

    def dropped(self, manifest: wire.Manifest) -> None:
        """An admitted push failed (bad bytes, a stalled or vanished sender)."""


class NoPushes:
    """The policy of a server that takes none."""

    def admit(self, manifest: wire.Manifest) -> tuple[str, str]:
        return "refused", "this server takes no pushes"

    def stored(self, pushed: Pushed) -> None:
        pass

    def dropped(self, manifest: wire.Manifest) -> None:
        pass


class RelayPolicy:
    """A relay takes any member's push (the swarm secret, when set, already admitted the connection)
    that names its peer id, and keeps the latest stored one of each peer, as it arrived, in `states`
    (at most `RELAY_MAX_PEERS`, the least recently pushed going first) to serve it on."""

    def __init__(self) -> None:
        self.states: dict[str, Published] = {}  # replaced, never changed in place: read on any thread

    def admit(self, manifest: wire.Manifest) -> tuple[str, str] | None:
        peer = manifest.meta.get("peer_id")
        return None if isinstance(peer, str) and peer else ("refused", "a relayed state must name its peer_id in meta")

    def stored(self, pushed: Pushed) -> None:
        peer, states = pushed.manifest.meta["peer_id"], dict(self.states)
        states.pop(peer, None)
        states[peer] = Published.of(pushed.manifest, pushed.raw)
        while len(states) > RELAY_MAX_PEERS:
            states.pop(next(iter(states)))
        self.states = states

    def dropped(self, manifest: wire.Manifest) -> None:
        pass


class PushReceiver:
    """Admission, grants and assembly of the pushes arriving at one server (see the module docstring)."""

    def __init__(self, policy: PushPolicy, *, require_hello: bool = True, max_state_bytes: int = 16 * 1024**3) -> None:
        self.policy, self.require_hello = policy, require_hello
        self.max_state_bytes = max_state_bytes
        self._hello_at: dict[bytes, float] = {}
        self._incoming: dict[bytes, _Incoming] = {}
        self.stats = {"pushes_stored": 0, "pushes_refused": 0, "push_bytes_received": 0}

    def saw_hello(self, ident: bytes, now: float) -> None:
        """The connection `ident` asked for our manifest: it may push for a while."""
        if len(self._hello_at) > 4096:  # forget connections that went quiet long ago
            self._hello_at = {k: t for k, t in self._hello_at.items() if now - t <= HELLO_VALID_S}
        self._hello_at[ident] = now

    def offer(self, ident: bytes, req: wire.PushOffer, address: str, now: float) -> tuple[wire.PushGrant, int]:
        """Take or refuse an offered push (raises `PushRefused`); when taken, the first grant and the
        bytes it lets in (what an upload cap charges for it)."""
        m = req.manifest
        self.expire(now)
        try:
            if self.require_hello and now - self._hello_at.get(ident, -1e18) > HELLO_VALID_S:
                raise PushRefused("refused", "a push is taken only on a connection that fetched from this island "
                                             f"in the last {HELLO_VALID_S:g} s")
            if ident in self._incoming:
                raise PushRefused("refused", "a push is already under way on this connection")
            if m.block > wire.MAX_PUT:
                raise PushRefused("refused", f"blocks of {m.block} bytes are larger than a put ({wire.MAX_PUT})")
            if m.state_bytes > self.max_state_bytes:
                raise PushRefused("refused", f"a state of {m.state_bytes} bytes is over max_state_bytes")
            if len(self._incoming) >= MAX_INCOMING:
                raise PushRefused("busy", f"{MAX_INCOMING} pushes are already under way")
            verdict = self.policy.admit(m)
            if verdict is not None:
                raise PushRefused(*verdict)
        except PushRefused:
            self.stats["pushes_refused"] += 1
            raise
        self._incoming[ident] = _Incoming(rid=req.rid, asm=Assembler(m, keep_encoded=True), granted=0, last_put=now,
                                          started=now, address=address)
        return self._grant(self._incoming[ident], force=True)

    def put(self, ident: bytes, req: wire.PushPut, now: float) -> tuple[wire.PushGrant | wire.PushStored | None, int]:
        """Check and keep one PUT; a further grant (and the bytes it lets in), `stored` when the state
        is whole, or None.

        Raises `PushRefused` (the push is dropped) for a PUT out of place, beyond its grant, or bad bytes.
        """
        inc = self._incoming.get(ident)
        if inc is None or inc.rid != req.rid or req.sid != inc.asm.manifest.sid:
            raise PushRefused("bad_request", "a put for no push under way on this connection")
        try:
            if req.offset != inc.asm.received or req.offset + req.length > inc.granted:
                raise PushRefused("bad_request", f"put [{req.offset}, +{req.length}) is not the next bytes within "
                                                 f"the grant (next {inc.asm.received}, granted {inc.granted})")
            try:
                inc.asm.accept(req.offset, req.payload)
            except BadPayload as e:
                raise PushRefused("bad_request", f"pushed state refused: {e}") from e
            self.stats["push_bytes_received"] += req.length
            inc.last_put = now
            if not inc.asm.done:
                return self._grant(inc)
            try:
                tensors = inc.asm.result()
            except BadPayload as e:
                raise PushRefused("bad_request", f"pushed state refused: {e}") from e
            del self._incoming[ident]
            self.stats["pushes_stored"] += 1
            self.policy.stored(Pushed(manifest=inc.asm.manifest, tensors=tensors, raw=inc.asm.raw,
                                  address=inc.address, seconds=now - inc.started))
            return wire.PushStored(rid=req.rid, sid=req.sid), 0
        except PushRefused:
            self._drop(ident)
            self.stats["pushes_refused"] += 1
            raise

    def _grant(self, inc: _Incoming, force: bool = False) -> tuple[wire.PushGrant | None, int]:
        """Let the sender run GRANT_WINDOW ahead of what arrived, in whole blocks, refreshed each half
        window; the grant (or None) and the bytes it newly lets in."""
        m = inc.asm.manifest
        upto = min(m.total, inc.asm.received + GRANT_WINDOW - GRANT_WINDOW % m.block)
        if not force and (upto <= inc.granted or (upto - inc.granted < GRANT_WINDOW // 2 and upto < m.total)):
            return None, 0
        more, inc.granted = upto - inc.granted, upto
        return wire.PushGrant(rid=inc.rid, sid=m.sid, upto=upto), more

    def expire(self, now: float) -> None:
        """Drop pushes whose sender went quiet."""
        for ident in [k for k, inc in self._incoming.items() if now - inc.last_put > STALL_S]:
            self._drop(ident)

    def forget(self, ident: bytes) -> None:
        """The connection went away: its push (if any) is dropped, and its fetch no longer counts."""
        self._drop(ident)
        self._hello_at.pop(ident, None)

    def _drop(self, ident: bytes) -> None:
        inc = self._incoming.pop(ident, None)
        if inc is not None:
            self.policy.dropped(inc.asm.manifest)
