"""The island record: what one island tells the swarm about itself, and its one validator.

An island announces one `IslandRecord` (where it serves snapshots, how far it has trained, how its
links behave) and reads everyone else's. Both discovery back-ends carry records in exactly this
form and check every record they read with `IslandRecord.from_dict`, the only validator of the
record (the DHT back-end runs it inside hivemind's record validation, `dht.IslandRecordValidator`).

A peer id is the fingerprint of the key that signs the peer's records (`fingerprint`), so a
reader can check that a record really belongs to the subkey it is stored under.

Plain Python on purpose (no hivemind, no torch, no zmq): the dashboard and `status` read records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from p2p_diloco.config import MAX_NAME_CHARS, REACH_MODES, valid_name
from p2p_diloco.errors import DiscoveryError

STATES = ("joining", "training", "syncing", "leaving")
REACHES = tuple(m for m in REACH_MODES if m != "auto")
"""How others reach an island: `direct` (they dial its endpoint) or `outbound` (they cannot: it
fetches from reachable islands and pushes its state to them over connections it opens)."""
MAX_INT = 2**62
"""Upper bound of every counter in a record (versions, tokens, bytes)."""
MAX_ENDPOINT_LEN = 256
PEER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENDPOINT_RE = re.compile(r"^tcp://[^\s/]{1,240}:[0-9]{1,5}$")
MODEL_RE = re.compile(r"^([0-9a-f]{16})?$")
MAX_ALONE_CHARS = 300
"""The longest text a record carries (`alone`, `fetches`, `time_split`)."""
FINGERPRINT_CHARS = 20
"""Hex digits of sha256 kept in a peer id (80 bits)."""
LABEL_ID_CHARS = 8
"""Characters of a peer id that stand for an island without a name (80-bit ids never collide in a
swarm that size)."""
MAX_DOUBTS = 16
"""Partners an island's record tells its doubts of, at most (`doubts`)."""
MAX_DOUBT = 10.0
"""The largest doubt a record tells (a partner's record beyond it is told as this much)."""
OPTIONAL_FIELDS = ("name", "fetched_from", "fetched_bps", "utilization", "time_split", "lr", "budget", "eta_s",
                   "doubts")
"""Fields a record may lack (records of islands older than the field): they take their default."""

_INT_FIELDS = ("version", "tokens", "bytes_sent", "bytes_received", "refused")
_FLOAT_FIELDS = ("tokens_per_s", "upload_bps", "download_bps", "fetched_bps", "started_at", "published_at",
                 "timestamp", "utilization")
_OPTIONAL_FLOAT_FIELDS = ("loss", "eval_loss", "lr", "budget", "eta_s")


def fingerprint(public_key: bytes) -> str:
    """The peer id that belongs to a signing key: the first 80 bits of its sha256, in hex."""
    return hashlib.sha256(public_key).hexdigest()[:FINGERPRINT_CHARS]


def island_label(name: str | None, peer_id: str | None) -> str:
    """How logs, progress lines, `status`, the dashboard and summaries show an island: its name, or
    its peer id's first `LABEL_ID_CHARS` characters when it has none ("-" for no island at all)."""
    return name or (peer_id or "-")[:LABEL_ID_CHARS]


def label_among(records: Mapping[str, IslandRecord], peer_id: str | None) -> str:
    """`island_label` of `peer_id`, named as its record among `records` names it (a partner's label)."""
    record = records.get(peer_id) if peer_id else None
    return island_label(record.name if record is not None else None, peer_id)


def _doubts(doubts: Any) -> dict[str, float]:
    """`doubts` checked (see `IslandRecord.doubts`), its values as floats."""
    rule = f"a map of at most {MAX_DOUBTS} peer ids ({FINGERPRINT_CHARS} characters at most) to numbers in [0, {MAX_DOUBT:g}]"
    if not isinstance(doubts, Mapping) or len(doubts) > MAX_DOUBTS:
        raise _bad("doubts", rule, doubts)
    for peer, v in doubts.items():
        if not (isinstance(peer, str) and len(peer) <= FINGERPRINT_CHARS and PEER_ID_RE.match(peer)) or isinstance(v, bool) \
                or not isinstance(v, (int, float)) or not 0 <= v <= MAX_DOUBT:
            raise _bad("doubts", rule, doubts)
    return {peer: float(v) for peer, v in doubts.items()}


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
    fetched_from: str | None = None
    """Peer id of the partner whose link this island's fetches measured last (`fetched_bps`):
    that partner reads it as the rate of its own uplink (`core.linkfit.LinkFit.heard`). Optional."""
    fetched_bps: float = 0.0
    """The rate that fetch measured between its chunks, bytes per second (0: none). Optional."""
    refused: int = 0
    """Partner states this island refused before mixing (implausible, another model or run); the
    dashboard shows each new refusal as an event."""
    last_refused: str | None = None
    """Peer id of the partner whose state was refused last."""
    alone: str = ""
    """Why the island mixes no partner's state while others train ("" while it does, or is the only
    one): its exchanges failed or arrived too stale for rounds (`peers.rounds.alone`)."""
    fetches: str = ""
    """With `--exchange auto`: what the island fetches now, `state` or `updates`, and why
    (`core.linkfit`: "updates: a whole state (1.29 MB) takes 4.34 rounds at 0.50 Mbit/s..."); "" for a
    fixed exchange."""
    started_at: float = 0.0
    """Unix time the island started."""
    published_at: float = 0.0
    """Unix time the island published its current state (0 before its first round ended): a
    round ends with a publish, so this is the phase of its rounds (`p2p_diloco.peers.rounds.pacing`)."""
    timestamp: float = 0.0
    """Unix time this record was made."""
    model: str = ""
    """Fingerprint of the island's model (`p2p_diloco.core.params.fingerprint`: 16 hex digits of
    the trainable parameters' names, shapes and dtypes; "" when unknown): partners whose
    fingerprint differs are never chosen."""

    utilization: float = 0.0
    """Share of the island's wall time since its first inner step spent in inner steps (0: none yet).
    Optional."""
    time_split: str = ""
    """Where that wall time went, share by share (`peers.rounds.timebook.TimeBook.split`: "inner 0.97 end
    0.01 ..."). Optional."""

    lr: float | None = None
    """The inner optimizer's learning rate now (None: unknown). Optional."""
    budget: float | None = None
    """Share of the island's budget (`IslandConfig.max_rounds`, `max_tokens`, `max_seconds`) spent, in
    [0, 1] (None: it has none). Optional."""
    eta_s: float | None = None
    """Seconds until that budget is spent at the pace so far (None: no budget, or nothing spent yet). Optional."""

    reach: str = "direct"
    """One of `REACHES`: `outbound` when others cannot dial `endpoint` (they must not try to fetch from it)."""
    name: str = ""
    """The island's name (`IslandConfig.name`; "" when it has none): see `island_label`. Optional
    (`OPTIONAL_FIELDS`): a record without it is read as nameless."""
    doubts: dict[str, float] = field(default_factory=dict, hash=False)
    """This island's record of its partners (`peers.admission.trust`), by peer id: how far their states
    sat back and what their mixes did, in [0, `MAX_DOUBT`]; at most `MAX_DOUBTS` of them. Others read
    it as one report among several (`trust.standing`). Optional."""

    def __post_init__(self) -> None:
        if not (isinstance(self.peer_id, str) and PEER_ID_RE.match(self.peer_id)):
            raise _bad("peer_id", "1-64 characters of [A-Za-z0-9_-]", self.peer_id)
        if not (isinstance(self.endpoint, str) and len(self.endpoint) <= MAX_ENDPOINT_LEN and ENDPOINT_RE.match(self.endpoint)):
            raise _bad("endpoint", "tcp://host:port (at most 256 characters)", self.endpoint)
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT):
                raise _bad(name, "an integer in [0, 2**62]", v)
        for name in _FLOAT_FIELDS + _OPTIONAL_FLOAT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_FLOAT_FIELDS:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise _bad(name, "a finite number" + (" or None" if name in _OPTIONAL_FLOAT_FIELDS else ""), v)
            if (name in _FLOAT_FIELDS or name in ("lr", "budget", "eta_s")) and v < 0 or (name == "budget" and v > 1):
                raise _bad(name, "in [0, 1]" if name == "budget" else ">= 0", v)
            object.__setattr__(self, name, float(v))  # ints become floats: what travels is strict (from_dict)
        if self.state not in STATES:
            raise _bad("state", f"one of {STATES}", self.state)
        if self.reach not in REACHES:
            raise _bad("reach", f"one of {REACHES}", self.reach)
        if not (isinstance(self.model, str) and MODEL_RE.match(self.model)):
            raise _bad("model", "16 lowercase hex digits or empty", self.model)
        if self.name != "" and not valid_name(self.name):
            raise _bad("name", f"empty or 1-{MAX_NAME_CHARS} printable ASCII characters", self.name)
        for name in ("alone", "fetches", "time_split"):
            v = getattr(self, name)
            if not (isinstance(v, str) and len(v) <= MAX_ALONE_CHARS and v.isascii() and v.isprintable()):
                raise _bad(name, f"printable ASCII of at most {MAX_ALONE_CHARS} characters", v)
        for name in ("last_partner", "last_refused", "fetched_from"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and PEER_ID_RE.match(v)):
                raise _bad(name, "None or a peer id", v)
        object.__setattr__(self, "doubts", _doubts(self.doubts))

    @property
    def label(self) -> str:
        """How the island is shown (`island_label`)."""
        return island_label(self.name, self.peer_id)

    @property
    def fetching(self) -> str:
        """What `fetches` says the island fetches now: `state`, `updates`, or "" (a fixed exchange)."""
        return self.fetches.partition(":")[0]

    def to_dict(self) -> dict[str, Any]:
        """All fields, always (the DHT schema refuses a record with a field missing)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> IslandRecord:
        """Build a record from untrusted data, which must be exactly what `to_dict` writes: unknown
        or missing fields (but `OPTIONAL_FIELDS`), and an int where a float belongs, raise
        `DiscoveryError` (so every copy of a record in the swarm has one form)."""
        if not isinstance(data, dict):
            raise DiscoveryError(f"island record must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - names)
        missing = sorted(names - set(data) - set(OPTIONAL_FIELDS))
        if unknown or missing:
            raise DiscoveryError(f"island record has unknown fields {unknown} / missing fields {missing}")
        for name in _FLOAT_FIELDS + _OPTIONAL_FLOAT_FIELDS:
            if isinstance(data.get(name), int):
                raise _bad(name, "a float (as to_dict writes it)", data[name])
        if isinstance(data.get("doubts"), Mapping) and any(isinstance(v, int) for v in data["doubts"].values()):
            raise _bad("doubts", "a map to floats (as to_dict writes it)", data["doubts"])
        return cls(**data)

    def replace(self, **changes: Any) -> IslandRecord:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
