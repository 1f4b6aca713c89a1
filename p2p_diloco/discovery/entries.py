"""The ZeroMQ discovery fallback's vocabulary: signed member entries, member tables, messages.

When libp2p cannot run, membership travels over ZeroMQ instead of the DHT. The bootstrap node runs
a rendezvous (`rendezvous.RendezvousServer`) where islands register and heartbeat; every island
also answers the same request on its own peer-exchange socket (`peer_exchange`), so member lists
spread island to island and the swarm outlives its bootstrap node. Both ends speak the messages
defined here and serve them through one request loop (`router`).

Trust, as in the DHT back-end: each entry is signed with the island's Ed25519 key and the peer id
is the key's fingerprint, so whoever relays an entry cannot alter it, forge one for another peer,
or withdraw another peer (a tombstone is signed too). Entries carry an absolute expiry (unix time,
like hivemind's `get_dht_time`), so clocks must agree to well within `expiry`.

Under a swarm secret the body's record is sealed (`sealing`): `[run_id, peer_id, None, expires,
{"sealed": BLOB}]`, where BLOB holds `{"px": ..., "record": ...}`, so the peer-exchange endpoint is
hidden too. A table without the secret (the rendezvous, an island of a run without one) keeps and
relays such an entry, checking its shape only; a table with it (`MemberTable(run_id, seal)`) opens
it and drops, quietly but counted, what does not open. Tombstones stay unsealed: they carry no
endpoint, and only the key that signed an entry can withdraw it.

Every message is msgpack, at most `MAX_MESSAGE_BYTES`, with a protocol version; garbage is answered
with an error, logged with its reason, and the server keeps serving. No sockets here.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from p2p_diloco.discovery.records import ENDPOINT_RE, PEER_ID_RE, IslandRecord, fingerprint
from p2p_diloco.discovery.sealing import MAX_SEALED_BYTES, RecordSeal, SealRefused, check_sealed, is_sealed
from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20
MAX_ENTRIES = 1024
"""Entries in one message (a bigger swarm is sampled)."""
MAX_BODY_BYTES = 4096
MAX_MEMBERS = 4096
"""Members one table keeps per run; more are refused (bounded memory on the bootstrap node)."""
MAX_EXPIRY = 3600.0 + 60.0
"""An entry may not claim to live longer than this from now (the config's expiry bound plus skew)."""


def encode(msg: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, **msg}, use_bin_type=True)


def decode(data: bytes) -> dict[str, Any]:
    """One message from untrusted bytes; `ValueError` naming what is wrong."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=MAX_BODY_BYTES, max_str_len=4096,
                              max_array_len=MAX_ENTRIES, max_map_len=64, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise ValueError(f"not msgpack: {type(e).__name__}: {e}") from e
    if not isinstance(msg, dict):
        raise ValueError(f"message must be a map, got {type(msg).__name__}")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ValueError(f"protocol version {msg.get('v')!r} is not {PROTOCOL_VERSION}")
    if not isinstance(msg.get("type"), str):
        raise ValueError("message has no type")
    return msg


class SigningKey:
    """An island's Ed25519 key; its fingerprint is the island's peer id."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self.public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.peer_id = fingerprint(self.public)

    def sign(self, body: bytes) -> bytes:
        return self._key.sign(body)


@dataclass(frozen=True)
class Entry:
    """One signed membership entry: a live record, a sealed one (`sealed`: its blob; `record` and
    `px` stay None until a table with the secret opens it), or a tombstone (neither)."""

    run_id: str
    peer_id: str
    px: str | None
    """The island's peer-exchange endpoint (None for an island that does not serve one)."""
    expires: float
    record: IslandRecord | None
    body: bytes
    key: bytes
    sig: bytes
    sealed: bytes | None = None
    """The sealed blob of the record (None for a plain record or a tombstone)."""

    @property
    def is_tombstone(self) -> bool:
        return self.record is None and self.sealed is None

    @classmethod
    def make(cls, key: SigningKey, run_id: str, px: str | None, expires: float, record: IslandRecord | None,
             seal: RecordSeal | None = None) -> Entry:
        """The own entry, signed; with a sealing `seal`, a live record travels sealed with its `px`."""
        if record is not None and seal is not None and seal.sealing:
            value = seal.wrap({"px": px, "record": record.to_dict()})
            body = msgpack.packb([run_id, key.peer_id, None, float(expires), value], use_bin_type=True)
            return cls(run_id, key.peer_id, px, float(expires), record, body, key.public, key.sign(body),
                       check_sealed(value))
        body = msgpack.packb([run_id, key.peer_id, px, float(expires), record.to_dict() if record else None], use_bin_type=True)
        return cls(run_id, key.peer_id, px, float(expires), record, body, key.public, key.sign(body))

    def wire(self) -> dict[str, bytes]:
        return {"b": self.body, "k": self.key, "s": self.sig}

    @classmethod
    def parse(cls, raw: Any, run_id: str, now: float) -> Entry:
        """Check an entry's shape and contents (not yet its signature: see `verify`); `ValueError` if bad."""
        if not isinstance(raw, dict) or set(raw) != {"b", "k", "s"}:
            raise ValueError("entry must be a map with keys b, k, s")
        body, key, sig = raw["b"], raw["k"], raw["s"]
        if not (isinstance(body, bytes) and isinstance(key, bytes) and len(key) == 32 and isinstance(sig, bytes) and len(sig) == 64):
            raise ValueError("entry needs a body, a 32-byte key and a 64-byte signature")
        try:
            fields = msgpack.unpackb(body, raw=False, max_str_len=1024, max_bin_len=MAX_SEALED_BYTES, max_array_len=8,
                                     max_map_len=32)
        except Exception as e:
            raise ValueError(f"entry body is not msgpack: {e}") from e
        if not (isinstance(fields, list) and len(fields) == 5):
            raise ValueError("entry body must be [run_id, peer_id, px, expires, record]")
        e_run, peer_id, px, expires, record = fields
        if e_run != run_id:
            raise ValueError(f"entry belongs to run {str(e_run)[:64]!r}, not {run_id!r}")
        if not (isinstance(peer_id, str) and PEER_ID_RE.match(peer_id) and peer_id == fingerprint(key)):
            raise ValueError("entry peer_id is not the fingerprint of its key")
        if px is not None and not (isinstance(px, str) and ENDPOINT_RE.match(px)):
            raise ValueError("entry px must be None or tcp://host:port")
        if not (isinstance(expires, float) and math.isfinite(expires) and expires <= now + MAX_EXPIRY):
            raise ValueError(f"entry expiry {expires!r} is not a time within {MAX_EXPIRY:g} s from now")
        rec = sealed = None
        if is_sealed(record):
            try:
                sealed = check_sealed(record)
            except DiscoveryError as e:
                raise ValueError(str(e)) from e
            if px is not None:
                raise ValueError("a sealed entry carries its px inside the seal")
        elif record is not None:
            try:
                rec = IslandRecord.from_dict(record)
            except DiscoveryError as e:
                raise ValueError(str(e)) from e
            if rec.peer_id != peer_id:
                raise ValueError("record peer_id differs from the entry's")
        return cls(run_id, peer_id, px, expires, rec, body, key, sig, sealed)

    def opened(self, seal: RecordSeal) -> Entry:
        """This entry as a member with `seal` reads it: a sealed record opened (with its px) when
        the seal holds the secret. `SealRefused` (counted by the seal) for a sealed entry that does
        not open, or a plain record in a sealed run; `ValueError` for an opened payload that is bad."""
        if not seal.sealing or self.is_tombstone:
            return self
        payload = seal.unwrap({"sealed": self.sealed} if self.sealed is not None else self.record.to_dict())
        if not (isinstance(payload, dict) and set(payload) == {"px", "record"}):
            raise ValueError("a sealed entry must hold {px, record}")
        px = payload["px"]
        if px is not None and not (isinstance(px, str) and ENDPOINT_RE.match(px)):
            raise ValueError("entry px must be None or tcp://host:port")
        try:
            rec = IslandRecord.from_dict(payload["record"])
        except DiscoveryError as e:
            raise ValueError(str(e)) from e
        if rec.peer_id != self.peer_id:
            raise ValueError("record peer_id differs from the entry's")
        return dataclasses.replace(self, px=px, record=rec)

    def verify(self) -> None:
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(self.sig, self.body)
        except InvalidSignature as e:
            raise ValueError(f"bad signature on the entry of {self.peer_id}") from e


class MemberTable:
    """The newest entry per peer id of one run; tombstones hide a peer until they expire.

    With a `seal` (an island's table), sealed entries are opened as they are merged, and what the
    seal refuses is neither kept nor relayed; without one (the rendezvous) they are kept as they are.
    """

    def __init__(self, run_id: str, seal: RecordSeal | None = None) -> None:
        self.run_id = run_id
        self.seal = seal
        self.entries: dict[str, Entry] = {}

    def merge(self, raws: list[Any], now: float) -> tuple[list[Entry], list[str]]:
        """Take the newer of each entry; returns (entries that changed, reasons for the refused ones)."""
        changed, refused = [], []
        for raw in raws[:MAX_ENTRIES]:
            try:
                entry = Entry.parse(raw, self.run_id, now)
                if entry.expires <= now:
                    continue
                known = self.entries.get(entry.peer_id)
                if known is not None and known.expires >= entry.expires:
                    continue  # not newer: no need to check its signature
                if known is None and len(self.entries) >= MAX_MEMBERS:
                    raise ValueError(f"run {self.run_id!r} already has {MAX_MEMBERS} members")
                if self.seal is not None:
                    entry = entry.opened(self.seal)
                entry.verify()
            except SealRefused:
                continue  # counted, and logged now and then, by the seal: an outsider may send it every poll
            except (ValueError, DiscoveryError, TypeError) as e:
                refused.append(str(e)[:200])
                continue
            self.entries[entry.peer_id] = entry
            changed.append(entry)
        return changed, refused

    def put(self, entry: Entry) -> None:
        self.entries[entry.peer_id] = entry

    def prune(self, now: float) -> list[Entry]:
        gone = [e for e in self.entries.values() if e.expires <= now]
        for e in gone:
            del self.entries[e.peer_id]
        return gone

    def live(self, now: float) -> list[Entry]:
        """Unexpired entries, tombstones included (they must spread too)."""
        return [e for e in self.entries.values() if e.expires > now]

    def records(self, now: float) -> dict[str, IslandRecord]:
        return {e.peer_id: e.record for e in self.entries.values() if e.expires > now and e.record is not None}

    def present(self, now: float) -> set[str]:
        """Peer ids with a live record, sealed ones included (what the rendezvous can tell)."""
        return {e.peer_id for e in self.entries.values() if e.expires > now and not e.is_tombstone}

    def hidden(self, now: float) -> int:
        """Live sealed entries that this table could not open (it holds no secret)."""
        return sum(1 for e in self.entries.values() if e.expires > now and e.sealed is not None and e.record is None)


def pick_entries(entries: list[Entry], first: str | None = None) -> list[dict[str, bytes]]:
    """Wire form of as many entries as fit in one message: `first`'s own entry, then a random sample."""
    entries = sorted(entries, key=lambda e: (e.peer_id != first, random.random()))
    out, size = [], 0
    for e in entries[:MAX_ENTRIES]:
        size += len(e.body) + 128
        if size > MAX_MESSAGE_BYTES - 65536:
            break
        out.append(e.wire())
    return out


def answer_sync(table: MemberTable, msg: dict[str, Any], node_id: str) -> tuple[bytes, list[Entry]]:
    """Merge a sync request's entries into `table`; the reply carries the table back."""
    entries = msg.get("entries")
    if not isinstance(entries, list):
        raise ValueError("sync needs a list of entries")
    now = time.time()
    changed, refused = table.merge(entries, now)
    if refused:
        logger.info("run %r: refused %d of %d entries, first because: %s", table.run_id, len(refused), len(entries), refused[0])
    entries = pick_entries(table.live(now), first=node_id)
    return encode({"type": "sync", "run": table.run_id, "node": node_id, "entries": entries}), changed
