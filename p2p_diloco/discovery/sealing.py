"""Sealed island records: under a swarm secret, only its holders can list or add members.

Signatures (RSA subkeys in the DHT, Ed25519 entries in the ZeroMQ fallback) stop anyone from
altering or withdrawing another island's record, but not from reading every member's endpoint or
announcing a member of their own: the bootstrap node serves any run to anyone who asks. With a
secret, a member therefore seals what it announces: the payload (the record's `to_dict()`, plus
the peer-exchange endpoint in the ZeroMQ fallback) is encrypted and authenticated, and what the
DHT or the rendezvous stores is `{"sealed": BLOB}`. The signatures stay as they are, on top.

    key   = scrypt(utf8(secret), salt=b"p2p-diloco discovery key v1", N=2**14, r=8, p=1, dklen=32)
    aad   = b"p2p-diloco sealed record v1|" + kind + b"|" + utf8(run_id)    (kind: b"dht" or b"zmq")
    BLOB  = 0x01 | nonce (12 random bytes) | AES-256-GCM(key, nonce, utf8(JSON(payload)), aad)

scrypt with its own salt keeps this key apart from the state exchange's CurveZMQ keys (derived
from the same secret) and makes each guess of a weak passphrase cost as much there as here: a
sealed record is readable by anyone who reaches the bootstrap node, so it is an offline target.
The run id in the associated data stops a record sealed for one run (or back-end) from opening
in another; the reader still checks it with `IslandRecord.from_dict` and against its signer.

A node that does not hold the secret (the bootstrap node, an island of a run without one) can only
check the shape: `check_sealed` (bytes of bounded size). A reader with the secret drops what does
not open, and what arrives unsealed, and counts it (`RecordSeal.refused`, logged at most every
`LOG_EVERY_S`); a reader without it counts the sealed records it cannot read (the `HIDDEN` marker),
so `status` and the dashboard can say why they see nobody (`membership.SEALED_HINT`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

SEALED_FIELD = "sealed"
"""The one key of a sealed value: `{"sealed": BLOB}`."""
SEAL_VERSION = b"\x01"
NONCE_BYTES = 12
TAG_BYTES = 16
MIN_SEALED_BYTES = len(SEAL_VERSION) + NONCE_BYTES + TAG_BYTES
MAX_SEALED_BYTES = 3072
"""Largest blob accepted: the largest valid record (every string at its longest, 16 doubts) with a
peer-exchange endpoint seals to 2.7 kB, and a ZeroMQ entry body (at most 4096 bytes) must still hold it."""
KEY_SALT = b"p2p-diloco discovery key v1"
AAD_PREFIX = b"p2p-diloco sealed record v1|"
KINDS = ("dht", "zmq")
LOG_EVERY_S = 30.0
"""A member logs the records it drops at most this often (an outsider may send them every poll)."""


class SealRefused(DiscoveryError):
    """A record that must be dropped: it does not open with the swarm secret, or is not sealed in a
    sealed run. Counted and logged by the `RecordSeal` that refused it, so callers drop it quietly."""


class _Hidden:
    """The marker of a sealed record that this member cannot read (it holds no secret)."""

    def __repr__(self) -> str:
        return "HIDDEN"


HIDDEN = _Hidden()


@functools.lru_cache(maxsize=4)
def discovery_key(secret: str) -> bytes:
    """The 32-byte AES key of sealed records (scrypt: ~16 MiB and tens of milliseconds, once per process)."""
    return hashlib.scrypt(secret.encode(), salt=KEY_SALT, n=2**14, r=8, p=1, dklen=32)


def is_sealed(value: Any) -> bool:
    """Whether a stored value claims the sealed form (a record dict never has a `sealed` field)."""
    return isinstance(value, dict) and SEALED_FIELD in value


def check_sealed(value: Any) -> bytes:
    """The blob of a sealed value, checked for shape only (what a node without the secret can
    check); `DiscoveryError` when it is not exactly `{"sealed": bytes}` of a bounded size."""
    if not (isinstance(value, dict) and set(value) == {SEALED_FIELD}):
        raise DiscoveryError('a sealed record must be exactly {"sealed": bytes}')
    blob = value[SEALED_FIELD]
    if not (isinstance(blob, bytes) and MIN_SEALED_BYTES <= len(blob) <= MAX_SEALED_BYTES):
        size = len(blob) if isinstance(blob, (bytes, str)) else type(blob).__name__
        raise DiscoveryError(f"a sealed record must be {MIN_SEALED_BYTES}-{MAX_SEALED_BYTES} bytes, got {size}")
    return blob


class Sealer:
    """Seals and opens payloads of one run and back-end with the key derived from the secret."""

    def __init__(self, secret: str, run_id: str, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self._aead = AESGCM(discovery_key(secret))
        self._aad = AAD_PREFIX + kind.encode() + b"|" + run_id.encode()

    def seal(self, payload: Any) -> dict[str, bytes]:
        """`{"sealed": BLOB}` for a JSON-able payload (a fresh random nonce every time)."""
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        blob = SEAL_VERSION + nonce + self._aead.encrypt(nonce, plain, self._aad)
        if len(blob) > MAX_SEALED_BYTES:
            raise DiscoveryError(f"a sealed record of {len(blob)} bytes exceeds {MAX_SEALED_BYTES}")
        return {SEALED_FIELD: blob}

    def open(self, value: Any) -> Any:
        """The payload of a sealed value; `DiscoveryError` when it is malformed, sealed with another
        secret or for another run, or tampered with."""
        blob = check_sealed(value)
        if blob[:1] != SEAL_VERSION:
            raise DiscoveryError(f"sealed record version {blob[0]} is not {SEAL_VERSION[0]}")
        nonce, box = blob[1:1 + NONCE_BYTES], blob[1 + NONCE_BYTES:]
        try:
            plain = self._aead.decrypt(nonce, box, self._aad)
        except InvalidTag:
            raise DiscoveryError("a sealed record does not open: another secret, another run, or tampered") from None
        try:
            return json.loads(plain)
        except ValueError as e:  # authentic but not JSON: a member's bug, not an outsider
            raise DiscoveryError(f"a sealed record holds no JSON: {e}") from e


class RecordSeal:
    """What one member does with record payloads: seals its own, opens the others', counts the rest.

    Without a secret it passes payloads through unchanged (the wire form of a run without a
    secret) and returns `HIDDEN` for sealed ones, saying so once: a warning for an island (it was
    surely meant to have the secret), info for an `observer` (`status` says it in its own words).
    With a secret it seals, and refuses (counted, logged at most every `LOG_EVERY_S`) whatever does
    not open and whatever arrives unsealed. Used by one thread at a time (the membership's thread).
    """

    def __init__(self, secret: str | None, run_id: str, kind: str, observer: bool = False) -> None:
        self.sealer = Sealer(secret, run_id, kind) if secret is not None else None
        self.run_id = run_id
        self.observer = observer
        self.refused = 0
        """Records dropped since the start because they did not open or were not sealed."""
        self._unlogged = 0
        self._last_log = float("-inf")
        self._told_hidden = False

    @property
    def sealing(self) -> bool:
        return self.sealer is not None

    def wrap(self, payload: Any) -> Any:
        """What to announce for `payload`: its sealed form with a secret, the payload itself without."""
        return payload if self.sealer is None else self.sealer.seal(payload)

    def unwrap(self, value: Any) -> Any:
        """The plain payload of a stored value (a tombstone, None, passes as it is); `HIDDEN` for a
        sealed one this member cannot open; `SealRefused` for one it must drop."""
        if value is None:
            return None
        if self.sealer is None:
            if not is_sealed(value):
                return value
            check_sealed(value)
            if not self._told_hidden:
                self._told_hidden = True
                logger.log(logging.INFO if self.observer else logging.WARNING, "run %r announces records sealed with "
                           "a swarm secret; without it (--secret-file) this member cannot see them", self.run_id)
            return HIDDEN
        if not is_sealed(value):
            self.refuse("an unsealed record in a run with a swarm secret")
        try:
            return self.sealer.open(value)
        except DiscoveryError as e:
            self.refuse(str(e))

    def refuse(self, reason: str) -> None:
        """Count a dropped record, log now and then, and raise `SealRefused`."""
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            logger.info("run %r: dropped %d record(s) that the swarm secret does not admit (%d in all); last: %s",
                        self.run_id, self._unlogged, self.refused, reason)
            self._unlogged, self._last_log = 0, now
        raise SealRefused(reason)
