"""The DHT record guard: our IslandRecordValidator (the record's one validator) plus RSA signatures.

Each case builds the exact `DHTRecord` a DHT node receives in `rpc_store` and asks the validators
a member node runs whether to accept it.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from p2p_diloco.discovery.dht import islands_key, make_validators
from p2p_diloco.discovery.records import IslandRecord, fingerprint

RUN = "schema-test"


@pytest.fixture(scope="module")
def keys():
    return RSAPrivateKey(), RSAPrivateKey()  # (honest, mallory)


def owner_subkey(key: RSAPrivateKey) -> bytes:
    return make_validators(RUN, key)[1].local_public_key


def good_value(key: RSAPrivateKey) -> dict:
    return IslandRecord(peer_id=fingerprint(owner_subkey(key)), endpoint="tcp://127.0.0.1:5000", version=4, tokens=99,
                        loss=2.0, state="training", timestamp=time.time()).to_dict()


def make_record(signer: RSAPrivateKey | None, value, subkey: bytes, run: str = RUN) -> DHTRecord:
    raw_subkey = MSGPackSerializer.dumps(subkey) if subkey is not None else b""
    rec = DHTRecord(DHTID.generate(source=islands_key(run)).to_bytes(), raw_subkey, MSGPackSerializer.dumps(value),
                    time.time() + 30)
    if signer is not None:
        rec = dataclasses.replace(rec, value=CompositeValidator(make_validators(run, signer)).sign_value(rec))
    return rec


def accepted(rec: DHTRecord, run: str = RUN) -> bool:
    """What a member node of `run` (with its own key) decides about an incoming record."""
    return CompositeValidator(make_validators(run, RSAPrivateKey())).validate(rec)


def test_an_owners_signed_record_and_tombstone_are_accepted(keys):
    honest, _ = keys
    assert accepted(make_record(honest, good_value(honest), owner_subkey(honest)))
    assert accepted(make_record(honest, None, owner_subkey(honest)))


@pytest.mark.parametrize("change", [
    {"version": 4.0}, {"tokens": "99"}, {"loss": float("nan")}, {"state": "sleeping"}, {"tokens_per_s": 1},
    {"endpoint": "tcp://" + "a" * 10_000 + ":1"}, {"version": 2**63}, {"last_partner": "x" * 100_000},
    {"evil": "extra field"}, {"reach": "auto"}, {"reach": None}, {"name": "n" * 33}, {"name": "line\nbreak"},
    {"doubts": {"b" * 20: 11.0}}, {"doubts": {"b" * 20: 1}}, {"doubts": {"bad id!": 1.0}}, {"doubts": [1.0]},
    {"doubts": {f"p{i:019d}": 1.0 for i in range(17)}}, {"doubts": {"b" * 20: float("nan")}},
])
def test_a_record_off_the_schema_is_refused(keys, change):
    honest, _ = keys
    value = {**good_value(honest), **change}
    assert not accepted(make_record(honest, value, owner_subkey(honest)))


def test_an_outbound_only_islands_record_is_accepted(keys):
    honest, _ = keys
    assert accepted(make_record(honest, {**good_value(honest), "reach": "outbound"}, owner_subkey(honest)))


def test_a_named_record_and_one_from_before_names_are_accepted(keys):
    honest, _ = keys
    assert accepted(make_record(honest, {**good_value(honest), "name": "gpu box 2"}, owner_subkey(honest)))
    old = good_value(honest)
    del old["name"]
    assert accepted(make_record(honest, old, owner_subkey(honest)))


def test_a_record_with_a_field_missing_is_refused(keys):
    honest, _ = keys
    value = good_value(honest)
    del value["eval_loss"]
    assert not accepted(make_record(honest, value, owner_subkey(honest)))


def test_nobody_can_write_another_peers_subkey(keys):
    honest, mallory = keys
    forged = good_value(honest)
    forged["endpoint"] = "tcp://6.6.6.6:6666"
    assert not accepted(make_record(mallory, forged, owner_subkey(honest)))  # signed with the wrong key
    assert not accepted(make_record(None, forged, owner_subkey(honest)))  # not signed at all
    assert not accepted(make_record(mallory, None, owner_subkey(honest)))  # a forged tombstone


def test_a_record_impersonating_another_peer_id_is_refused(keys):
    honest, mallory = keys
    value = good_value(honest)  # honest's peer_id, stored under mallory's own subkey with mallory's signature
    assert not accepted(make_record(mallory, value, owner_subkey(mallory)))


def test_the_key_holds_only_owner_subkeys_with_records(keys):
    honest, _ = keys
    assert not accepted(make_record(honest, good_value(honest), b"plain-subkey"))  # subkey without an owner key
    assert not accepted(make_record(honest, good_value(honest), None))  # a plain value instead of a dictionary


def test_a_node_that_does_not_know_the_run_still_checks_signatures(keys):
    """Like the bootstrap node: it cannot know every run's key, so only signatures apply there."""
    honest, mallory = keys
    off_schema = make_record(honest, {**good_value(honest), "version": "x"}, owner_subkey(honest))
    assert accepted(off_schema, run="another-run")
    assert not accepted(off_schema)  # every member of the run refuses it, and readers re-check
    assert not accepted(make_record(mallory, good_value(honest), owner_subkey(honest)), run="another-run")


# -- sealed records (a run with a swarm secret): nodes check the shape, readers open --------------

def test_a_sealed_record_is_accepted_by_nodes_without_the_secret(keys):
    from p2p_diloco.discovery.sealing import Sealer

    honest, _ = keys
    sealed = Sealer("swarm secret", RUN, "dht").seal(good_value(honest))
    assert accepted(make_record(honest, sealed, owner_subkey(honest)))
    assert accepted(make_record(honest, {"sealed": b"\x01" + b"x" * 60}, owner_subkey(honest)))  # opened by readers


@pytest.mark.parametrize("value", [
    {"sealed": b"x" * 4000}, {"sealed": b"x"}, {"sealed": "not bytes"}, {"sealed": b"x" * 64, "endpoint": "tcp://a:1"},
])
def test_a_sealed_record_off_its_shape_is_refused(keys, value):
    honest, _ = keys
    assert not accepted(make_record(honest, value, owner_subkey(honest)))


def test_a_sealed_record_still_needs_its_owners_signature(keys):
    from p2p_diloco.discovery.sealing import Sealer

    honest, mallory = keys
    sealed = Sealer("swarm secret", RUN, "dht").seal(good_value(honest))
    assert not accepted(make_record(mallory, sealed, owner_subkey(honest)))


def test_an_identity_file_names_the_same_peer_as_hivemind_whichever_wrote_it(tmp_path):
    """`discovery.peerid` (a ZeroMQ-only bootstrap node names itself without loading hivemind) reads
    hivemind's identity files as hivemind does, and hivemind reads the files it writes."""
    from hivemind.p2p import P2P, PeerID

    from p2p_diloco.discovery.peerid import generate_identity, peer_id_from_identity
    from p2p_diloco.errors import DiscoveryError

    theirs, ours = tmp_path / "hivemind.key", tmp_path / "ours.key"
    P2P.generate_identity(str(theirs))
    assert peer_id_from_identity(str(theirs)) == str(PeerID.from_identity(theirs.read_bytes()))
    generate_identity(str(ours))
    assert peer_id_from_identity(str(ours)) == str(PeerID.from_identity(ours.read_bytes()))
    assert (ours.stat().st_mode & 0o777) == 0o400
    created = tmp_path / "new.key"  # missing: created, and the same id every time after
    assert peer_id_from_identity(str(created)) == peer_id_from_identity(str(created)) != peer_id_from_identity(str(ours))
    for bad in (b"", b"\x08\x01\x12\x02ab", b"\x12\xff", b"\x08\x00\x12\x03abc"):
        path = tmp_path / "bad.key"
        path.write_bytes(bad)
        with pytest.raises(DiscoveryError, match="identity file"):
            peer_id_from_identity(str(path))
