"""Who is in the swarm: the island record and the membership interface both back-ends implement.

An island announces one `IslandRecord` (where it serves snapshots, how far it has trained, how its
links behave) and reads everyone else's. Two back-ends keep these records: the hivemind DHT
(`p2p_diloco.discovery`, the default) and a ZeroMQ rendezvous with peer exchange
(`p2p_diloco.rendezvous`, for machines where the libp2p daemon cannot run). Both follow hivemind's
`ProgressTracker`: one record per peer under a shared per-run key, the peer id as subkey, an
expiry that a background thread keeps pushing forward, and a tombstone (`None`) on a clean leave.

This module is plain Python on purpose (no hivemind, no torch, no zmq at import time): the
dashboard and `status` import it to read records. `open_membership` imports a back-end lazily.

A peer id is the fingerprint of the key that signs the peer's records (`fingerprint`), so a
reader can check that a record really belongs to the subkey it is stored under.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import logging
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from p2p_diloco.config import DiscoveryConfig

STATES = ("joining", "training", "syncing", "leaving")
MAX_INT = 2**62
"""Upper bound of every counter in a record (versions, tokens, bytes)."""
MAX_ENDPOINT_LEN = 256
PEER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENDPOINT_RE = re.compile(r"^tcp://[^\s/]{1,240}:[0-9]{1,5}$")
FINGERPRINT_CHARS = 20
"""Hex digits of sha256 kept in a peer id (80 bits)."""

_INT_FIELDS = ("version", "tokens", "bytes_sent", "bytes_received")
_FLOAT_FIELDS = ("tokens_per_s", "upload_bps", "download_bps", "started_at", "published_at", "timestamp")
_OPTIONAL_FLOAT_FIELDS = ("loss", "eval_loss")


def fingerprint(public_key: bytes) -> str:
    """The peer id that belongs to a signing key: the first 80 bits of its sha256, in hex."""
    return hashlib.sha256(public_key).hexdigest()[:FINGERPRINT_CHARS]


def _bad(field: str, rule: str, value: Any) -> DiscoveryError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return DiscoveryError(f"island record field {field!r} must be {rule}, got {shown}")


@dataclass(frozen=True, kw_only=True)
class IslandRecord:
    """What one island tells the swarm about itself; every field is bounded and checked."""

    peer_id: str
    """Fingerprint of the island's signing key (see `Membership.peer_id`)."""
    endpoint: str
    """ZeroMQ address where the island serves its snapshots, `tcp://host:port`."""
    version: int = 0
    """Outer steps behind the island's current state."""
    tokens: int = 0
    """Tokens of training behind the island's current state."""
    tokens_per_s: float = 0.0
    """Recent inner-loop throughput."""
    loss: float | None = None
    """Last training loss (None before the first step)."""
    eval_loss: float | None = None
    """Last held-out loss (None until evaluated)."""
    state: str = "joining"
    """One of `STATES`."""
    upload_bps: float = 0.0
    """Measured upload rate, bytes per second."""
    download_bps: float = 0.0
    """Measured download rate, bytes per second."""
    bytes_sent: int = 0
    bytes_received: int = 0
    last_partner: str | None = None
    """Peer id of the island last mixed with."""
    started_at: float = 0.0
    """Unix time the island started."""
    published_at: float = 0.0
    """Unix time the island published its current state (0 before its first round ended): a
    round ends with a publish, so this is the phase of its rounds (`peers.pacing`)."""
    timestamp: float = 0.0
    """Unix time this record was made."""

    def __post_init__(self) -> None:
        if not (isinstance(self.peer_id, str) and PEER_ID_RE.match(self.peer_id)):
            raise _bad("peer_id", "1-64 characters of [A-Za-z0-9_-]", self.peer_id)
        if not (isinstance(self.endpoint, str) and len(self.endpoint) <= MAX_ENDPOINT_LEN and ENDPOINT_RE.match(self.endpoint)):
            raise _bad("endpoint", "tcp://host:port (at most 256 characters)", self.endpoint)
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT):
                raise _bad(name, f"an integer in [0, 2**62]", v)
        for name in _FLOAT_FIELDS + _OPTIONAL_FLOAT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_FLOAT_FIELDS:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise _bad(name, "a finite number" + (" or None" if name in _OPTIONAL_FLOAT_FIELDS else ""), v)
            if name in _FLOAT_FIELDS and v < 0:
                raise _bad(name, ">= 0", v)
            object.__setattr__(self, name, float(v))  # ints become floats: the DHT schema is strict
        if self.state not in STATES:
            raise _bad("state", f"one of {STATES}", self.state)
        if self.last_partner is not None and not (isinstance(self.last_partner, str) and PEER_ID_RE.match(self.last_partner)):
            raise _bad("last_partner", "None or a peer id", self.last_partner)

    def to_dict(self) -> dict[str, Any]:
        """All fields, always (the DHT schema refuses a record with a field missing)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> IslandRecord:
        """Build a record from untrusted data; unknown or missing fields raise `DiscoveryError`."""
        if not isinstance(data, dict):
            raise DiscoveryError(f"island record must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - names)
        missing = sorted(names - set(data))
        if unknown or missing:
            raise DiscoveryError(f"island record has unknown fields {unknown} / missing fields {missing}")
        return cls(**data)

    def replace(self, **changes: Any) -> IslandRecord:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


class Membership(abc.ABC):
    """The live member list of one run, behind a synchronous facade.

    A background thread keeps the own record fresh and the view of the others current; no method
    waits on the network for longer than a short, bounded time.
    """

    kind: str
    """`"dht"` or `"zmq"`."""

    @property
    @abc.abstractmethod
    def peer_id(self) -> str:
        """The id this member announces under (records must carry it)."""

    @abc.abstractmethod
    def announce(self, record: IslandRecord) -> None:
        """Set or replace the own record; it is stored soon and refreshed until `leave`."""

    @abc.abstractmethod
    def members(self) -> dict[str, IslandRecord]:
        """Live members by peer id, own record included; expired and departed ones are absent."""

    @abc.abstractmethod
    def refresh(self, timeout: float = 10.0) -> dict[str, IslandRecord]:
        """Read the member list from the network now (at most `timeout` seconds), then `members()`."""

    @abc.abstractmethod
    def leave(self) -> None:
        """Withdraw the own record so that it disappears from everyone's view at once."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the background work and release sockets and processes (idempotent)."""

    def _check_own(self, record: IslandRecord) -> None:
        if not isinstance(record, IslandRecord):
            raise TypeError(f"announce() takes an IslandRecord, got {type(record).__name__}")
        if record.peer_id != self.peer_id:
            raise DiscoveryError(f"record peer_id {record.peer_id!r} is not this member's id {self.peer_id!r}")

    def __enter__(self) -> Membership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class BackgroundMembership(Membership):
    """The facade both back-ends share: the own record and leaving, in front of a background thread.

    A subclass's `__init__` sets `_lock`, `_record`, `_dirty`, `_left`, `_leave_requested`,
    `_left_event`, `_stop`, `_polls`, `_poll_done` (a condition on `_lock`), `observer` and
    `_thread`, and implements `_live_records()` (the others' records, under the lock) and
    `_request_poll()`. `_kick()` wakes the thread when it sleeps on an event; `_announced(first)`
    runs under the lock when a record is set; `_after_stop()` releases what the thread did not own.
    The thread stores `_record` while `_dirty`, sends the tombstone when `_leave_requested`, sets
    `_left_event` once it is out, and counts `_polls` (notifying `_poll_done`) as it reads the swarm.
    """

    _leave_timeout: float = 5.0
    _join_timeout: float = 10.0

    @abc.abstractmethod
    def _live_records(self) -> dict[str, IslandRecord]:
        """The others' live records by peer id (called with `_lock` held)."""

    @abc.abstractmethod
    def _request_poll(self) -> int:
        """Ask the thread for a fresh read of the swarm (with `_lock` held); returns how many
        polls from now will include it."""

    def _after_stop(self) -> None:
        """After the thread has stopped (or was abandoned): release what it does not own."""

    def _kick(self) -> None:
        """Wake the background thread (no-op for a thread that polls)."""

    def _announced(self, first: bool) -> None:
        """Called under the lock when a record is set; `first` on the very first one."""

    def announce(self, record: IslandRecord) -> None:
        self._check_own(record)
        if self.observer:
            raise DiscoveryError("an observer cannot announce a record")
        with self._lock:
            if self._left:
                raise DiscoveryError("announce() after leave()")
            self._announced(self._record is None)
            self._record, self._dirty = record, True
        self._kick()

    def members(self) -> dict[str, IslandRecord]:
        with self._lock:
            out = self._live_records()
            out.pop(self.peer_id, None)
            if self._record is not None and not self._left:
                out[self.peer_id] = self._record
        return out

    def leave(self) -> None:
        with self._lock:
            if self._left or self._record is None or not self._thread.is_alive():
                self._left = True
                return
            self._leave_requested = True
        self._kick()
        if not self._left_event.wait(timeout=self._leave_timeout):
            logger.warning("leave: the tombstone was not sent within %.0f s", self._leave_timeout)

    def refresh(self, timeout: float = 10.0) -> dict[str, IslandRecord]:
        """Read the swarm now (waits at most `timeout`) and return `members()`."""
        with self._lock:
            target = self._polls + self._request_poll()
        self._kick()
        with self._poll_done:
            self._poll_done.wait_for(lambda: self._polls >= target or self._stop.is_set(), timeout)
        return self.members()

    def shutdown(self) -> None:
        if self._stop.is_set():
            return
        self.leave()
        self._stop.set()
        self._kick()
        self._thread.join(timeout=self._join_timeout)
        if self._thread.is_alive():
            logger.warning("the %s membership thread did not stop within %.0f s; going on without it",
                           self.kind, self._join_timeout)
        self._after_stop()


def open_membership(config: DiscoveryConfig, *, observer: bool = False) -> Membership:
    """Join (or, with `observer=True`, only watch) the run described by `config`.

    `config.discovery` picks the back-end: `dht`, `zmq`, or `auto` (the DHT when a multiaddr is
    given and the libp2p daemon starts, otherwise the ZeroMQ fallback, with a warning naming the
    reason). Raises `DiscoveryError` when no bootstrap address answers within
    `config.connect_timeout` seconds.
    """
    from p2p_diloco import addresses

    kind = addresses.choose_backend(config)
    if kind == "dht":
        from p2p_diloco import discovery

        try:
            return discovery.DhtMembership(config, observer=observer)
        except discovery.DaemonUnavailable as e:
            if config.discovery != "auto":
                raise DiscoveryError(f"the libp2p daemon could not start: {e}") from e
            import logging

            logging.getLogger(__name__).warning(
                "the libp2p daemon could not start (%s); using the ZeroMQ fallback for discovery", e
            )
    from p2p_diloco import peer_exchange

    return peer_exchange.ZmqMembership(config, observer=observer)


def format_islands(records: dict[str, IslandRecord] | list[IslandRecord], now: float) -> str:
    """A plain-text table of island records (what `p2p-diloco status` prints)."""
    rows = sorted(records.values() if isinstance(records, dict) else records, key=lambda r: r.peer_id)
    head = ("peer id", "state", "version", "tokens", "tok/s", "loss", "age s", "endpoint")
    body = [(r.peer_id, r.state, str(r.version), str(r.tokens), f"{r.tokens_per_s:.0f}",
             "-" if r.loss is None else f"{r.loss:.4f}", f"{max(0.0, now - r.timestamp):.1f}" if r.timestamp else "-",
             r.endpoint) for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
    return "\n".join(lines)
