"""Island records, bootstrap addresses, the discovery config and the ZeroMQ fallback's signed entries."""

from __future__ import annotations

import json
import math
import time

import msgpack
import pytest

from p2p_diloco import addresses
from p2p_diloco.cli.watch import format_islands
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import choose_backend
from p2p_diloco.discovery.records import IslandRecord, fingerprint, island_label, label_among
from p2p_diloco.discovery.entries import (
    MAX_MESSAGE_BYTES, Entry, MemberTable, SigningKey, answer_sync, decode, encode, pick_entries
)
from p2p_diloco.errors import ConfigError, DiscoveryError

PID = "0123456789abcdef0123"
MADDR = "/ip4/127.0.0.1/tcp/4100/p2p/QmYunsfm4xYoHz4uJMkxLXo4pXxjcCXHSoV3r3ukZQ1wcE"


def record(**kw) -> IslandRecord:
    base = dict(peer_id=PID, endpoint="tcp://127.0.0.1:5555", version=3, tokens=12288, tokens_per_s=1500.5, loss=2.5,
                state="training", started_at=1.7e9, timestamp=1.7e9 + 10)
    return IslandRecord(**{**base, **kw})


def test_record_round_trips_through_dict_json_and_msgpack():
    r = record(last_partner="fedcba9876543210fedc", eval_loss=2.75, bytes_sent=10, bytes_received=20,
               fetched_from="fedcba9876543210fedc", fetched_bps=1e6, utilization=0.97,
               time_split="inner 0.970 mix 0.010 end 0.010 eval 0.005 checkpoint 0.000 other 0.005",
               doubts={"fedcba9876543210fedc": 0.25})
    assert IslandRecord.from_dict(r.to_dict()) == r
    assert IslandRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert IslandRecord.from_dict(msgpack.unpackb(msgpack.packb(r.to_dict()))) == r
    assert set(r.to_dict()) == {"peer_id", "endpoint", "version", "tokens", "tokens_per_s", "loss", "eval_loss", "state",
                                "upload_bps", "download_bps", "bytes_sent", "bytes_received", "last_partner",
                                "started_at", "published_at", "timestamp", "model", "refused", "last_refused", "alone", "fetches",
                                "reach", "name", "fetched_from", "fetched_bps", "utilization", "time_split", "lr", "budget",
                                "eta_s", "doubts"}
    older = {k: v for k, v in r.to_dict().items()
             if k not in ("fetched_from", "fetched_bps", "utilization", "time_split", "doubts")}
    assert IslandRecord.from_dict(older) == r.replace(fetched_from=None, fetched_bps=0.0, utilization=0.0,
                                                      time_split="", doubts={})  # an older island's record
    with pytest.raises(DiscoveryError, match="time_split"):
        r.replace(time_split="x" * 301)
    with pytest.raises(DiscoveryError, match="fetched_from"):
        r.replace(fetched_from="not a peer id!")


def test_integer_rates_become_floats_so_the_strict_dht_schema_accepts_them():
    r = record(tokens_per_s=7, upload_bps=0, loss=3)
    assert type(r.tokens_per_s) is float and type(r.upload_bps) is float and type(r.loss) is float
    assert r.to_dict()["tokens_per_s"] == 7.0


@pytest.mark.parametrize("field,value", [
    ("peer_id", ""), ("peer_id", "x" * 65), ("peer_id", "has space"), ("peer_id", 12),
    ("endpoint", "http://127.0.0.1:1"), ("endpoint", "tcp://127.0.0.1"), ("endpoint", "tcp://" + "a" * 300 + ":1"),
    ("version", -1), ("version", 2**62 + 1), ("version", True), ("version", 1.0), ("tokens", "5"),
    ("tokens_per_s", math.nan), ("tokens_per_s", math.inf), ("tokens_per_s", -1.0), ("loss", math.nan),
    ("eval_loss", -math.inf), ("loss", "2.5"), ("state", "sleeping"), ("last_partner", "bad id!"),
    ("timestamp", -5.0), ("started_at", None), ("published_at", -1.0), ("bytes_sent", 2**64),
    ("reach", "auto"), ("reach", None), ("name", "x" * 33), ("name", "tab\there"), ("name", "caf\u00e9"),
    ("name", " padded"), ("name", None),
])
def test_record_rejects_bad_fields_by_name(field, value):
    with pytest.raises(DiscoveryError, match=field):
        record(**{field: value})


def test_from_dict_rejects_unknown_missing_and_non_mapping():
    d = record().to_dict()
    with pytest.raises(DiscoveryError, match="unknown"):
        IslandRecord.from_dict({**d, "evil": 1})
    del d["name"]  # a record from before names is read as nameless
    assert IslandRecord.from_dict(d) == record()
    del d["loss"]
    with pytest.raises(DiscoveryError, match="missing"):
        IslandRecord.from_dict(d)
    with pytest.raises(DiscoveryError, match="mapping"):
        IslandRecord.from_dict([1, 2])


def test_format_islands_lists_every_record_by_its_label():
    named = record(peer_id="aaaa", loss=None, version=9, reach="outbound", name="gpu box 2", last_partner=PID)
    text = format_islands([record(last_partner="aaaa"), named], now=1.7e9 + 12)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["island", "peer", "id", "state"]
    assert lines[0].split()[-4:] == ["reach", "fetches", "partner", "endpoint"]
    assert lines[1].split()[:2] == ["01234567", PID] and "2.5000" in lines[1] and "2.0" in lines[1]  # age 2 s
    assert lines[2].startswith("gpu box 2  aaaa ") and " - " in lines[2] and " 9 " in lines[2]
    assert " direct " in lines[1] and " outbound " in lines[2]
    assert " gpu box 2  tcp://" in lines[1] and lines[2].split()[-2] == "01234567"  # each partner by its label
    alone = format_islands([record(alone="no partner state mixed in 10 rounds while 1 other train")], now=1.7e9)
    assert alone.splitlines()[-1] == "01234567 trains alone: no partner state mixed in 10 rounds while 1 other train"
    why = "a whole state (1.29 MB) takes 4.300 rounds to move at 0.50 Mbit/s"
    auto = format_islands([record(fetches=f"updates: {why}"), record(peer_id="aaaa", fetches=f"state: {why}")], now=1.7e9)
    assert auto.splitlines()[-1] == f"01234567 fetches updates: {why}"  # why, for an island on updates only
    assert [line.split()[-3] for line in auto.splitlines()[1:3]] == ["updates", "state"]  # sorted by label
    split = "inner 0.970 mix 0.010 end 0.010 eval 0.005 checkpoint 0.000 other 0.005"
    timed = format_islands([record(utilization=0.9704, time_split=split), record(peer_id="aaaa")], now=1.7e9)
    head, first, second = timed.splitlines()[:3]
    util = head.split().index("util") - 1  # ("peer id" is two words in the head)
    assert first.split()[util] == "0.970" and second.split()[util] == "-"  # none measured yet: "-"
    assert timed.splitlines()[-1] == f"01234567 spent its time: {split}"


def test_one_label_for_an_island_its_name_or_its_peer_id_prefix():
    named, nameless = record(name="gpu box 2"), record(peer_id="fedcba9876543210fedc")
    assert (named.label, nameless.label) == ("gpu box 2", "fedcba98")
    assert island_label(None, PID) == island_label("", PID) == "01234567" and island_label(None, None) == "-"
    members = {r.peer_id: r for r in (named, nameless)}
    assert [label_among(members, p) for p in (PID, "fedcba9876543210fedc", "aaaabbbbccccddddeeee", None)] == [
        "gpu box 2", "fedcba98", "aaaabbbb", "-"]  # an island not (or no longer) listed: its prefix


def test_an_island_name_is_checked_once_at_load():
    from p2p_diloco.config import IslandConfig

    assert IslandConfig(name="island-3").name == "island-3"
    for bad in ("", "x" * 33, "two\nlines", "caf\u00e9", " padded", 7):
        with pytest.raises(ConfigError, match="island.name"):
            IslandConfig(name=bad)


def test_bootstrap_addresses_parse_and_derive_the_rendezvous():
    a = addresses.parse(MADDR)
    assert (a.kind, a.host, a.port, a.rendezvous()) == ("dht", "127.0.0.1", 4100, "tcp://127.0.0.1:4101")
    z = addresses.parse("tcp://10.0.0.2:7000")
    assert (z.kind, z.host, z.port, z.rendezvous()) == ("zmq", "10.0.0.2", 7000, "tcp://10.0.0.2:7000")
    assert addresses.parse("/ip6/::1/tcp/9/p2p/QmYunsfm4xYoHz4uJMkxLXo4pXxjcCXHSoV3r3ukZQ1wcE").rendezvous() == "tcp://[::1]:10"
    assert addresses.rendezvous_endpoints([MADDR, "tcp://127.0.0.1:4101", "tcp://h:1"]) == ["tcp://127.0.0.1:4101", "tcp://h:1"]
    assert addresses.dht_multiaddrs([MADDR, "tcp://h:1"]) == [MADDR]
    for bad in ["", "127.0.0.1:4100", "/ip4/127.0.0.1/tcp/4100", "tcp://h:99999", "tcp://h", "udp://h:1", "/ip4/h/tcp/65535/p2p/Qm" + "a" * 44]:
        with pytest.raises(ValueError):
            addresses.parse(bad)


def test_backend_choice():
    choose = lambda **kw: choose_backend(DiscoveryConfig(**kw))  # noqa: E731
    assert choose(bootstrap=(MADDR,)) == "dht"
    assert choose(bootstrap=("tcp://h:1",)) == "zmq"
    assert choose(bootstrap=("tcp://h:1", MADDR)) == "dht"
    assert choose() == "dht"
    assert choose(bootstrap=(MADDR,), discovery="zmq") == "zmq"
    with pytest.raises(DiscoveryError, match="multiaddr"):
        choose(bootstrap=("tcp://h:1",), discovery="dht")


@pytest.mark.parametrize("kw,field", [
    (dict(run_id="a.b"), "run_id"), (dict(run_id=""), "run_id"), (dict(bootstrap=("nope",)), "bootstrap"),
    (dict(discovery="udp"), "discovery"), (dict(expiry=0.5), "expiry"), (dict(refresh=30.0), "refresh"),
    (dict(poll=0.0), "poll"), (dict(port=70000), "port"), (dict(host="0.0.0.0"), "announce_host"),
    (dict(connect_timeout=0), "connect_timeout"),
])
def test_discovery_config_names_the_bad_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        DiscoveryConfig(**kw)


def test_discovery_config_defaults_and_list_bootstrap():
    c = DiscoveryConfig(bootstrap=[MADDR])
    assert c.bootstrap == (MADDR,) and c.expiry == 30.0 and c.refresh < c.expiry and c.visible_host == "127.0.0.1"
    assert DiscoveryConfig(host="0.0.0.0", announce_host="10.1.2.3").visible_host == "10.1.2.3"


# -- the ZeroMQ fallback's signed entries -------------------------------------------------------

def entry(key: SigningKey, run="r", expires=None, rec="live", px="tcp://127.0.0.1:7000") -> Entry:
    expires = time.time() + 30 if expires is None else expires
    r = record(peer_id=key.peer_id) if rec == "live" else rec
    return Entry.make(key, run, px, expires, r)


def test_entries_verify_and_bind_the_peer_id_to_the_key():
    key = SigningKey()
    assert key.peer_id == fingerprint(key.public)
    e = Entry.parse(entry(key).wire(), "r", time.time())
    e.verify()
    assert e.record.peer_id == key.peer_id and e.px == "tcp://127.0.0.1:7000"


def test_a_relayed_entry_cannot_be_altered_or_claimed_by_another_key():
    key, mallory = SigningKey(), SigningKey()
    wire = entry(key).wire()
    fields = msgpack.unpackb(wire["b"])
    fields[4]["endpoint"] = "tcp://6.6.6.6:1"
    tampered = {**wire, "b": msgpack.packb(fields)}
    with pytest.raises(ValueError, match="signature"):
        Entry.parse(tampered, "r", time.time()).verify()
    stolen = {**wire, "k": mallory.public, "s": mallory.sign(wire["b"])}  # re-signed by another key
    with pytest.raises(ValueError, match="fingerprint"):
        Entry.parse(stolen, "r", time.time())
    with pytest.raises(ValueError, match="run"):
        Entry.parse(wire, "other-run", time.time())


@pytest.mark.parametrize("raw", [
    None, {}, {"b": b"x", "k": b"k", "s": b"s"}, {"b": b"\xc1", "k": b"k" * 32, "s": b"s" * 64},
    {"b": msgpack.packb([1, 2]), "k": b"k" * 32, "s": b"s" * 64}, {"b": b"", "k": b"k" * 32, "s": b"s" * 64, "x": 1},
])
def test_malformed_entries_are_refused(raw):
    with pytest.raises(ValueError):
        Entry.parse(raw, "r", time.time())


def test_entries_claiming_a_far_future_or_carrying_a_bad_record_are_refused():
    key = SigningKey()
    with pytest.raises(ValueError, match="expiry"):
        Entry.parse(entry(key, expires=time.time() + 10**6).wire(), "r", time.time())
    body = msgpack.packb(["r", key.peer_id, None, time.time() + 5, {**record(peer_id=key.peer_id).to_dict(), "version": -1}])
    with pytest.raises(ValueError, match="version"):
        Entry.parse({"b": body, "k": key.public, "s": key.sign(body)}, "r", time.time())
    body = msgpack.packb(["r", key.peer_id, None, time.time() + 5, record().to_dict()])  # someone else's record
    with pytest.raises(ValueError, match="peer_id"):
        Entry.parse({"b": body, "k": key.public, "s": key.sign(body)}, "r", time.time())


def test_table_keeps_the_newest_entry_and_tombstones_hide_a_peer():
    a, b = SigningKey(), SigningKey()
    t = MemberTable("r")
    now = time.time()
    changed, refused = t.merge([entry(a, expires=now + 10).wire(), entry(b, expires=now + 10).wire()], now)
    assert len(changed) == 2 and not refused and set(t.records(now)) == {a.peer_id, b.peer_id}
    changed, _ = t.merge([entry(a, expires=now + 5).wire()], now)  # older: ignored
    assert not changed and t.entries[a.peer_id].expires == pytest.approx(now + 10)
    t.merge([entry(a, expires=now + 11, rec=None).wire()], now)  # newer tombstone
    assert set(t.records(now)) == {b.peer_id}
    assert len(t.live(now)) == 2  # the tombstone still travels
    assert set(t.records(now + 10.5)) == set() and {e.peer_id for e in t.prune(now + 10.5)} == {b.peer_id}


def test_answer_sync_merges_and_replies_with_the_table():
    a, b = SigningKey(), SigningKey()
    t = MemberTable("r")
    t.put(entry(a))
    reply, changed = answer_sync(t, {"entries": [entry(b).wire(), {"b": b"junk"}]}, "node-1")
    msg = decode(reply)
    assert msg["type"] == "sync" and msg["node"] == "node-1" and len(msg["entries"]) == 2
    assert [e.peer_id for e in changed] == [b.peer_id]
    with pytest.raises(ValueError):
        answer_sync(t, {"entries": "nope"}, "node-1")


@pytest.mark.parametrize("data,why", [
    (b"\xc1", "msgpack"), (msgpack.packb([1]), "map"), (msgpack.packb({"v": 99, "type": "sync"}), "version"),
    (msgpack.packb({"v": 1}), "type"), (b"x" * (MAX_MESSAGE_BYTES + 1), "exceeds"),
    (msgpack.packb({"v": 1, "type": "sync", "entries": [0] * 2000}), "msgpack"),
])
def test_decode_refuses_garbage_with_a_reason(data, why):
    with pytest.raises(ValueError, match=why):
        decode(data)
    assert decode(encode({"type": "sync"})) == {"v": 1, "type": "sync"}


def test_a_message_carries_the_own_entry_first_and_stays_under_the_size_limit():
    keys = [SigningKey() for _ in range(3)]
    entries = [entry(k) for k in keys]
    picked = pick_entries(entries, first=keys[2].peer_id)
    assert len(picked) == 3 and picked[0] == entries[2].wire()
    many = [entries[0]] * 5000  # more than one message may hold
    picked = pick_entries(many)
    assert len(encode({"type": "sync", "entries": picked})) <= MAX_MESSAGE_BYTES
    assert 0 < len(picked) <= 1024
