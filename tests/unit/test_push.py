"""Pushes (protocol 1.1): an island nobody can dial delivers its state over the connection it opened.

Real sockets on 127.0.0.1: a server that takes pushes, a fetcher that fetches and then pushes on the
same connection, and the ways a push is refused without losing anything (no fetch first, a bad
block, another model, a full inbox); a relay that keeps each member's latest pushed state and
serves it to fetchers that name the peer.
"""

from __future__ import annotations

import time

import pytest
import torch

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import TransportError
from p2p_diloco.exchange import payload, wire
from p2p_diloco.exchange.client import Fetcher, fetch
from p2p_diloco.exchange.server import SnapshotServer

pytestmark = pytest.mark.timeout(60)


def _state(seed: int, n: int = 300_000) -> dict[str, torch.Tensor]:
    return {"phi": torch.randn(n, generator=torch.Generator().manual_seed(seed))}


def _own(seed: int, codec: str = "int8", peer: str = "pusher", n: int = 300_000):
    return payload.pack(_state(seed, n), codec, version=3, tokens=1000, meta={"peer_id": peer})


@pytest.fixture
def servers():
    made = []

    def make(**kw) -> SnapshotServer:
        s = SnapshotServer(config=NetworkConfig(compression="int8"), **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


class Policy:
    """Takes every push (or refuses the peers in `odd`), keeping what arrived and what was dropped."""

    def __init__(self, odd: tuple[str, ...] = ()) -> None:
        self.odd, self.got, self.lost = odd, [], []

    def admit(self, manifest):
        return ("refused", "another model") if manifest.meta.get("peer_id") in self.odd else None

    def stored(self, pushed) -> None:
        self.got.append(pushed)

    def dropped(self, manifest) -> None:
        self.lost.append(manifest)


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_fetch_then_a_push_on_the_same_connection_delivers_the_whole_checked_state(servers):
    policy = Policy()
    got = policy.got
    srv = servers(pushes=policy)
    srv.publish(_state(0), version=5, tokens=10)
    manifest, buf = _own(1, n=3_000_000)  # 3 MB of int8: three puts of 1 MiB within the first grant
    with Fetcher(srv.endpoint) as f:
        assert f.fetch(timeout=10).version == 5
        assert f.push(manifest, memoryview(buf.numpy()), timeout=10) == manifest.total
    _wait_for(lambda: got)
    pushed = got[0]
    assert pushed.meta["peer_id"] == "pusher" and pushed.manifest.version == 3
    assert torch.equal(pushed.tensors["phi"].float(), _decoded(manifest, buf)["phi"])
    stats = srv.stats()
    assert stats["pushes_stored"] == 1 and stats["push_bytes_received"] == manifest.total


def _decoded(manifest, buf) -> dict[str, torch.Tensor]:
    asm = payload.Assembler(manifest)
    asm.accept(0, memoryview(buf.numpy()))
    return {k: v.reshape(-1) for k, v in asm.result().items()}


def test_a_state_larger_than_one_grant_window_arrives_through_several_grants(servers):
    policy = Policy()
    got = policy.got
    srv = servers(pushes=policy)
    srv.publish(_state(0, 1000), version=1, tokens=1)
    manifest, buf = _own(2, codec="fp32", n=5_000_000)  # 20 MB: more than two 8 MiB windows
    with Fetcher(srv.endpoint) as f:
        f.manifest(timeout=10)
        f.push(manifest, memoryview(buf.numpy()), timeout=10)
    _wait_for(lambda: got)
    assert torch.equal(got[0].tensors["phi"].float(), _state(2, 5_000_000)["phi"])


def test_pushes_are_refused_without_a_fetch_first_or_by_a_server_that_takes_none(servers):
    manifest, buf = _own(1)
    takes = servers(pushes=Policy())
    takes.publish(_state(0), version=1, tokens=1)
    with Fetcher(takes.endpoint) as f, pytest.raises(TransportError, match="refused our push: .*fetched from"):
        f.push(manifest, memoryview(buf.numpy()), timeout=5)
    plain = servers()
    plain.publish(_state(0), version=1, tokens=1)
    with Fetcher(plain.endpoint) as f:
        f.manifest(timeout=5)
        with pytest.raises(TransportError, match="takes no pushes"):
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
    assert takes.stats()["pushes_refused"] == 1 and fetch(takes.endpoint, timeout=5).version == 1


def test_the_admission_check_refuses_another_model_before_any_byte_flows(servers):
    policy = Policy(odd=("odd",))
    got = policy.got
    srv = servers(pushes=policy)
    srv.publish(_state(0), version=1, tokens=1)
    manifest, buf = _own(1, peer="odd")
    with Fetcher(srv.endpoint) as f:
        f.manifest(timeout=5)
        with pytest.raises(TransportError, match="another model"):
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
        assert srv.stats()["push_bytes_received"] == 0
        good, gbuf = _own(2, peer="fine")
        f.manifest(timeout=5)
        f.push(good, memoryview(gbuf.numpy()), timeout=5)  # the same connection still works
    _wait_for(lambda: got)
    assert [p.meta["peer_id"] for p in got] == ["fine"]


def test_a_corrupted_push_is_refused_and_the_server_keeps_serving(servers):
    policy = Policy()
    got = policy.got
    srv = servers(pushes=policy)
    srv.publish(_state(0), version=1, tokens=1)
    manifest, buf = _own(1, n=1_000_000)
    bad = buf.clone()
    bad[manifest.block + 7] ^= 0xFF  # one flipped byte in the second block
    with Fetcher(srv.endpoint) as f:
        f.manifest(timeout=5)
        with pytest.raises(TransportError, match="digest mismatch"):
            f.push(manifest, memoryview(bad.numpy()), timeout=5)
    assert not got and srv.stats()["pushes_refused"] == 1 and len(policy.lost) == 1  # the policy hears of it
    assert fetch(srv.endpoint, timeout=5).version == 1


def test_a_relay_keeps_each_members_latest_state_and_serves_it_by_peer_id(servers):
    relay = servers(relay=True)
    for peer, seed in (("alpha", 1), ("beta", 2), ("alpha", 3)):  # alpha pushes twice: the newer one stays
        manifest, buf = _own(seed, peer=peer)
        with Fetcher(relay.endpoint) as f:  # a relay takes pushes without a fetch first
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
    assert sorted(relay.relayed()) == ["alpha", "beta"]
    with Fetcher(relay.endpoint, peer="alpha") as f:
        snap = f.fetch(timeout=5)
    assert torch.equal(snap.tensors["phi"].reshape(-1), _decoded(*_own(3, peer="alpha"))["phi"])
    with Fetcher(relay.endpoint, peer="gamma") as f, pytest.raises(TransportError, match="no state of peer gamma"):
        f.fetch(timeout=5)
    with Fetcher(relay.endpoint) as f, pytest.raises(TransportError, match="nothing published"):
        f.fetch(timeout=5)


def test_push_messages_round_trip_and_a_put_must_be_two_frames():
    manifest, _ = _own(1, n=1000)
    for msg in (wire.PushOffer(rid=3, manifest=manifest), wire.PushGrant(rid=3, sid=manifest.sid, upto=128)):
        frames = wire.encode(msg)
        decode = wire.decode_request if isinstance(msg, wire.PushOffer) else wire.decode_reply
        assert decode(frames) == msg
    put = wire.encode(wire.PushPut(rid=4, sid=9, offset=0, length=3, payload=b"abc"))
    assert wire.decode_request(put).payload.tobytes() == b"abc"
    with pytest.raises(Exception, match="2 frame"):
        wire.decode_request(put[:1])


def test_with_a_swarm_secret_only_members_push_and_a_relay_needs_the_secret(servers):
    from p2p_diloco.errors import AuthRefused

    cfg, secret = NetworkConfig(compression="int8"), "correct horse"
    policy = Policy()
    srv = SnapshotServer(config=cfg, secret=secret, pushes=policy)
    relay = SnapshotServer(config=cfg, secret=secret, relay=True)
    try:
        srv.publish(_state(0), version=1, tokens=1)
        manifest, buf = _own(1)
        with Fetcher(srv.endpoint, cfg, secret=secret) as f:  # over CurveZMQ, as a member
            f.manifest(timeout=5)
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
        with Fetcher(relay.endpoint, cfg, secret=secret) as f:
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
        for endpoint in (srv.endpoint, relay.endpoint):
            with Fetcher(endpoint, NetworkConfig()) as f, pytest.raises(AuthRefused):  # no secret: no handshake
                f.push(manifest, memoryview(buf.numpy()), timeout=5)
        _wait_for(lambda: policy.got)
        assert len(policy.got) == 1 and relay.relayed() == {"pusher": 3}
    finally:
        srv.close()
        relay.close()


def test_a_connection_that_goes_away_drops_its_push_and_the_policy_hears_of_it():
    from p2p_diloco.exchange.push import PushReceiver

    policy = Policy()
    receiver = PushReceiver(policy)
    manifest, _ = _own(1)
    receiver.saw_hello(b"conn", now=0.0)
    grant, charge = receiver.offer(b"conn", wire.PushOffer(rid=1, manifest=manifest), "10.0.0.2", now=1.0)
    assert grant.upto == charge == manifest.total  # a small state: granted whole at once
    receiver.forget(b"conn")
    assert policy.lost == [manifest]
    with pytest.raises(Exception, match="fetched from"):  # and its fetch no longer counts
        receiver.offer(b"conn", wire.PushOffer(rid=2, manifest=manifest), "10.0.0.2", now=2.0)
