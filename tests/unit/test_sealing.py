"""Sealed island records: what holders of the swarm secret can open, what everyone else can check,
and how the ZeroMQ fallback's tables treat sealed entries (the DHT validator's side is in
test_discovery_schema.py, whole swarms in tests/integration/test_discovery_*.py)."""

from __future__ import annotations

import hashlib
import logging
import time

import msgpack
import pytest

from p2p_diloco.discovery.entries import MAX_BODY_BYTES, Entry, MemberTable, SigningKey
from p2p_diloco.config import MAX_NAME_CHARS
from p2p_diloco.discovery.records import MAX_ALONE_CHARS, MAX_DOUBTS, IslandRecord
from p2p_diloco.discovery.sealing import (
    HIDDEN, MAX_SEALED_BYTES, MIN_SEALED_BYTES, RecordSeal, Sealer, SealRefused, check_sealed, discovery_key
)
from p2p_diloco.errors import DiscoveryError

SECRET = "correct horse battery staple"


def record(peer_id: str = "a" * 20, **changes) -> IslandRecord:
    return IslandRecord(peer_id=peer_id, endpoint="tcp://10.0.0.1:5000", version=3, tokens=4096, loss=2.5,
                        state="training", timestamp=1.7e9, **changes)


def test_a_sealed_record_opens_to_the_same_record():
    sealer = Sealer(SECRET, "run", "dht")
    sealed = sealer.seal(record().to_dict())
    assert set(sealed) == {"sealed"} and isinstance(sealed["sealed"], bytes)
    assert b"10.0.0.1" not in sealed["sealed"] and b"training" not in sealed["sealed"]  # nothing readable
    assert IslandRecord.from_dict(sealer.open(sealed)) == record()
    assert sealer.seal(record().to_dict()) != sealed  # a fresh nonce every time
    assert IslandRecord.from_dict(Sealer(SECRET, "run", "dht").open(sealed)) == record()  # any holder opens it


@pytest.mark.parametrize("secret,run,kind", [("battery staple", "run", "dht"), (SECRET, "other-run", "dht"),
                                             (SECRET, "run", "zmq")])
def test_another_secret_run_or_back_end_does_not_open_it(secret, run, kind):
    sealed = Sealer(SECRET, "run", "dht").seal(record().to_dict())
    with pytest.raises(DiscoveryError, match="does not open"):
        Sealer(secret, run, kind).open(sealed)


@pytest.mark.parametrize("where", [0, 1, 12, 13, 40, -1])
def test_a_tampered_byte_anywhere_is_refused(where):
    sealer = Sealer(SECRET, "run", "dht")
    blob = bytearray(sealer.seal(record().to_dict())["sealed"])
    blob[where] ^= 0x01  # the version, the nonce, the ciphertext, the tag
    with pytest.raises(DiscoveryError):
        sealer.open({"sealed": bytes(blob)})


@pytest.mark.parametrize("value", [
    {"sealed": b"x" * (MAX_SEALED_BYTES + 1)}, {"sealed": b"x" * (MIN_SEALED_BYTES - 1)}, {"sealed": "text"},
    {"sealed": b"x" * 64, "peer_id": "a"}, {"sealed": None}, {"sealed": [b"x" * 64]},
])
def test_only_bounded_bytes_pass_the_shape_check(value):
    with pytest.raises(DiscoveryError):
        check_sealed(value)


def test_the_largest_record_fits_the_bound_and_a_zmq_entry():
    key = SigningKey()
    big = IslandRecord(peer_id=key.peer_id, endpoint="tcp://" + "h" * 240 + ":65535", version=2**62, tokens=2**62,
                       tokens_per_s=1.2345678901234567e300, loss=-1.2345678901234567e-300, eval_loss=-1.2e300,
                       state="training", upload_bps=1.2345678901234567e300, download_bps=1.2345678901234567e300,
                       bytes_sent=2**62, bytes_received=2**62, last_partner="b" * 64, started_at=1.2345678901234567e300,
                       published_at=1.2345678901234567e300, timestamp=1.2345678901234567e300, model="0" * 16,
                       refused=2**62, last_refused="c" * 64, alone="a" * MAX_ALONE_CHARS, fetches="f" * MAX_ALONE_CHARS,
                       name="n" * MAX_NAME_CHARS, doubts={f"{k:020x}": 1 / 3 for k in range(MAX_DOUBTS)})
    entry = Entry.make(key, "r" * 64, "tcp://" + "h" * 240 + ":65535", time.time() + 60, big,
                       RecordSeal(SECRET, "r" * 64, "zmq"))
    assert len(entry.sealed) < MAX_SEALED_BYTES and len(entry.body) < MAX_BODY_BYTES  # (2725 and 3.1 kB)


def test_the_discovery_key_is_not_the_exchange_key():
    """Same secret, separate keys: scrypt with its own salt (the exchange's is "...swarm keys v1")."""
    exchange_seed = hashlib.scrypt(SECRET.encode(), salt=b"p2p-diloco swarm keys v1", n=2**14, r=8, p=1, dklen=64)
    key = discovery_key(SECRET)
    assert len(key) == 32 and key not in (exchange_seed[:32], exchange_seed[32:])


def test_without_a_secret_payloads_pass_and_sealed_ones_are_hidden():
    seal = RecordSeal(None, "run", "dht")
    plain = record().to_dict()
    assert seal.wrap(plain) is plain  # the wire form of a run without a secret is unchanged
    assert seal.unwrap(plain) is plain and seal.unwrap(None) is None
    assert seal.unwrap(Sealer(SECRET, "run", "dht").seal(plain)) is HIDDEN
    assert seal.refused == 0


def test_with_a_secret_what_does_not_open_is_refused_counted_and_logged_now_and_then(caplog):
    seal = RecordSeal(SECRET, "run", "dht")
    assert seal.unwrap(seal.wrap(record().to_dict())) == record().to_dict()
    assert seal.unwrap(None) is None  # tombstones stay plain: only their signer can store one
    with caplog.at_level(logging.INFO, logger="p2p_diloco.discovery.sealing"):
        for _ in range(5):
            with pytest.raises(SealRefused, match="does not open"):
                seal.unwrap(Sealer("another secret", "run", "dht").seal(record().to_dict()))
        with pytest.raises(SealRefused, match="unsealed"):
            seal.unwrap(record().to_dict())  # an outsider's plain record
    assert seal.refused == 6
    assert len([r for r in caplog.records if "dropped" in r.message]) == 1  # rate-limited


# -- the ZeroMQ fallback's tables -----------------------------------------------------------------

def entry(key: SigningKey, secret: str | None, run: str = "r1", rec: IslandRecord | None = None,
          px: str | None = "tcp://10.0.0.1:6000") -> Entry:
    rec = rec or record(key.peer_id)
    return Entry.make(key, run, px, time.time() + 30, rec, RecordSeal(secret, run, "zmq") if secret else None)


def test_an_entry_without_a_secret_has_todays_wire_form():
    key = SigningKey()
    expires = time.time() + 30
    today = msgpack.packb(["r1", key.peer_id, "tcp://10.0.0.1:6000", expires, record(key.peer_id).to_dict()],
                          use_bin_type=True)
    for seal in (None, RecordSeal(None, "r1", "zmq")):
        e = Entry.make(key, "r1", "tcp://10.0.0.1:6000", expires, record(key.peer_id), seal)
        assert e.body == today and e.sealed is None


def test_a_sealed_entry_hides_the_record_and_the_px():
    key = SigningKey()
    e = entry(key, SECRET)
    run, peer_id, px, _, value = msgpack.unpackb(e.body)
    assert (run, peer_id, px, set(value)) == ("r1", key.peer_id, None, {"sealed"})
    assert b"10.0.0.1" not in e.body


def test_a_member_table_opens_sealed_entries_and_drops_what_does_not_open():
    honest, outsider, guesser = SigningKey(), SigningKey(), SigningKey()
    table = MemberTable("r1", RecordSeal(SECRET, "r1", "zmq"))
    now = time.time()
    changed, refused = table.merge([entry(honest, SECRET).wire(), entry(outsider, None).wire(),
                                    entry(guesser, "a wrong guess").wire()], now)
    assert [e.peer_id for e in changed] == [honest.peer_id] and refused == []  # seal refusals are counted, not listed
    assert table.records(now) == {honest.peer_id: record(honest.peer_id)}
    assert table.entries[honest.peer_id].px == "tcp://10.0.0.1:6000"
    assert set(table.entries) == {honest.peer_id}  # nothing refused is kept, so nothing refused is relayed
    assert table.seal.refused == 2
    tomb = Entry.make(outsider, "r1", None, now + 30, None)
    assert table.merge([tomb.wire()], now)[0] == [tomb]  # a signed tombstone withdraws only its signer


def test_a_table_without_the_secret_keeps_and_relays_sealed_entries_unread():
    """The rendezvous (and a member without the secret): signatures and shapes checked, nothing read."""
    honest = SigningKey()
    for table in (MemberTable("r1"), MemberTable("r1", RecordSeal(None, "r1", "zmq"))):
        now = time.time()
        changed, refused = table.merge([entry(honest, SECRET).wire()], now)
        assert refused == [] and changed[0].record is None and changed[0].px is None
        assert table.present(now) == {honest.peer_id} and table.records(now) == {} and table.hidden(now) == 1
        assert table.live(now)[0].wire() == entry_wire(changed[0])


def entry_wire(e: Entry) -> dict:
    return {"b": e.body, "k": e.key, "s": e.sig}


def test_a_sealed_entry_with_a_clear_px_or_a_bad_blob_is_refused_by_everyone():
    key = SigningKey()
    now = time.time()
    good = entry(key, SECRET)
    run, peer_id, _, expires, value = msgpack.unpackb(good.body)
    for body in (msgpack.packb([run, peer_id, "tcp://1.2.3.4:5", expires, value]),  # px beside the seal
                 msgpack.packb([run, peer_id, None, expires, {"sealed": b"x" * 8}])):  # too short to be a seal
        raw = {"b": body, "k": key.public, "s": key.sign(body)}
        _, refused = MemberTable("r1").merge([raw], now)
        assert len(refused) == 1
