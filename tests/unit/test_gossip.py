"""The background gossip worker against a real snapshot server on 127.0.0.1."""

from __future__ import annotations

import time

import pytest
import torch
from p2p_diloco.peers.gossip.worker import GossipWorker

from p2p_diloco.config import NetworkConfig
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.exchange.server import SnapshotServer

NET = NetworkConfig(compression="fp32")


@pytest.fixture
def server():
    s = SnapshotServer(config=NET)
    yield s
    s.close()


def _publish(server: SnapshotServer, version: int) -> None:
    server.publish({"phi": torch.full((1000,), float(version))}, version, 1000 * version)


def _record(server: SnapshotServer, version: int) -> IslandRecord:
    return IslandRecord(peer_id="partner", endpoint=server.endpoint, version=version, tokens=1, state="training")


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.01)
    return value


def _result(worker: GossipWorker, timeout: float = 10.0):
    _wait_for(lambda: not worker.busy, timeout, "the fetch to finish")
    return worker.take()


def test_fetches_the_latest_state_and_hands_it_out_once(server):
    _publish(server, 3)
    worker = GossipWorker(NET, timeout_s=5.0)
    assert worker.start(_record(server, 3))
    result = _result(worker)
    assert result.error is None and result.snapshot.version == 3 and result.nbytes > 0
    assert torch.equal(result.snapshot.tensors["phi"].float(), torch.full((1000,), 3.0))  # kept encoded until mixed
    assert result.waited_s < 0.5
    assert worker.take() is None


def test_waits_for_the_partner_to_publish_the_version_asked_for(server):
    _publish(server, 3)
    worker = GossipWorker(NET, timeout_s=5.0)
    started = time.monotonic()
    assert worker.start(_record(server, 3), min_version=4, wait_until=started + 5.0)
    # the worker's one HELLO waits at the server: no manifest is served, none is polled for
    _wait_for(lambda: server.stats()["hellos_waiting"] == 1, 5.0, "the worker's HELLO to wait at the server")
    assert worker.busy and not worker.start(_record(server, 3))  # one fetch at a time
    assert server.stats()["manifests_served"] == 0 and server.stats()["requests"] == 1
    published = time.monotonic()
    _publish(server, 4)
    result = _result(worker)
    assert result.snapshot.version == 4 and server.stats()["hellos_waiting"] == 0
    # it waited until the publish, and the answer left within a turn of the server's loop (50 ms)
    assert published - started - 0.1 < result.waited_s < published - started + 0.5, (result.waited_s, published - started)
    assert result.seconds < 1.0  # the transfer alone, so the partner's link rate is not blamed for the wait


def test_wait_result_returns_the_moment_a_fetch_lands(server):
    """What the final mix waits on: no polling, and nothing to wait for once taken."""
    _publish(server, 3)
    worker = GossipWorker(NET, timeout_s=5.0)
    assert not worker.wait_result(0.05)  # nothing runs
    assert worker.start(_record(server, 3), min_version=4, wait_until=time.monotonic() + 5.0)
    assert not worker.wait_result(0.2)  # held at the server until version 4 exists
    _publish(server, 4)
    assert worker.wait_result(5.0) and worker.take().snapshot.version == 4
    assert not worker.wait_result(0.0)
    worker.close()


def test_takes_what_the_partner_has_when_the_wait_ends(server):
    _publish(server, 3)
    worker = GossipWorker(NET, timeout_s=5.0)
    assert worker.start(_record(server, 3), min_version=4, wait_until=time.monotonic() + 0.3)
    result = _result(worker)
    assert result.snapshot.version == 3 and 0.2 < result.waited_s < 2.0


def test_a_dead_partner_costs_only_that_exchange(server):
    _publish(server, 3)
    record = _record(server, 3)
    server.close()
    worker = GossipWorker(NET, timeout_s=1.0)
    assert worker.start(record, min_version=4, wait_until=time.monotonic() + 5.0)
    started = time.monotonic()
    result = _result(worker)
    assert result.snapshot is None and result.error.startswith("Transport"), result.error
    assert time.monotonic() - started < 3.0  # the fetch timeout, not the wait for a version


def test_a_finished_fetch_is_never_lost_to_a_new_one(server):
    """The race the hand-off must survive: a fetch finishes, and a new one is asked for before it was taken."""
    _publish(server, 1)
    worker = GossipWorker(NET, timeout_s=5.0, measure=lambda snap: 0.25)
    assert worker.start(_record(server, 1))
    _wait_for(lambda: worker.has_result, 10, "the first fetch to finish")
    _publish(server, 2)
    assert not worker.start(_record(server, 2))  # refused: the finished state waits to be taken
    first = worker.take()
    assert first.snapshot.version == 1 and first.measured == 0.25 and worker.take() is None
    _wait_for(lambda: not worker.busy, 10, "the first fetch's thread to close its connection")
    assert worker.start(_record(server, 2))
    assert _result(worker).snapshot.version == 2
    worker.close()


def _public_sender(server, parts: int = 1):
    """The run's initial weights, a public state that starts there, and a function that advances it
    (in `parts` fragments) and publishes it on `server` (`digest`: a false one; `shift`: fragments
    placed that many values further), and a gossip worker that follows it."""
    from p2p_diloco.core.params import weights_digest
    from p2p_diloco.core.public import PublicCopies, PublicState, Update
    from p2p_diloco.exchange.public_views import PublicView

    initial = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    sender = PublicState(initial, "sign", from_init=True)

    def publish(digest=None, shift=0):
        sender.advance(initial + 0.1 * sender.version + 0.1, parts=parts)
        updates = tuple(Update(u.values, u.at + shift) for u in sender.updates)
        server.publish({"phi": initial}, sender.version, 1000)
        server.publish_public(PublicView(chain=sender.chain, version=sender.version, pub=sender.pub, updates=updates,
                                         outer_version=sender.version, tokens=1000, meta={},
                                         digest=digest or weights_digest(sender.pub), from_init=True, parts=parts))

    copies = PublicCopies(initial=initial.clone())
    return initial, sender, publish, copies, GossipWorker(NET, timeout_s=5.0, copies=copies,
                                                          measure_public=lambda copy: 0.5)


def test_a_worker_follows_a_partners_public_state_and_refuses_one_that_drifted(server):
    """`exchange="updates"`: the first fetch starts from the initial weights (`INIT`), the next brings
    the copy up by one update; a copy whose digest disagrees with the sender's is dropped, and the
    exchange fails as the partner's fault (`bad_state`)."""
    _, sender, publish, copies, worker = _public_sender(server)
    for version in (1, 2):
        publish()
        assert worker.start(_record(server, version))
        result = _result(worker)
        assert result.public is not None and result.measured == 0.5 and torch.equal(result.public.pub, sender.pub)
        assert list(result.snapshot.tensors) == [f"u{version}"] and result.public.version == version
    publish(digest="0" * 16)
    assert worker.start(_record(server, 3))
    result = _result(worker)
    assert result.snapshot is None and result.bad_state and "pub_digest" in result.error
    assert copies.held("partner") is None  # dropped: the next fetch asks for the public state whole


def test_a_worker_follows_a_public_state_sent_in_fragments_and_refuses_a_fragment_out_of_bounds(server):
    """Updates of one fragment each: the copy follows bit for bit, knows the sender's fragments (what
    it mixes is scaled by them, `partner_state`), and an update placed past the end is refused."""
    from p2p_diloco.core.public import PublicState
    from p2p_diloco.peers.gossip.worker import partner_state

    initial, sender, publish, _, worker = _public_sender(server, parts=4)
    for version in (1, 2):
        publish()
        assert worker.start(_record(server, version))
        result = _result(worker)
        assert torch.equal(result.public.pub, sender.pub) and result.public.parts == 4
        assert list(result.snapshot.tensors) == [f"u{version}@{sender.updates[-1].at}"]
    own = PublicState(initial, "sign")
    mixed = partner_state(result.snapshot, 1000, public=result.public, own_public=own, anchor=initial)
    assert torch.allclose(mixed.phi, initial + (sender.pub - initial) / 4)
    publish(shift=800)  # a fragment of 250 values placed at 800+: past the end of 1000
    assert worker.start(_record(server, 3))
    result = _result(worker)
    assert result.snapshot is None and result.bad_state and "at" in result.error
    worker.close()


def test_a_running_fetch_reports_its_progress_until_it_is_done():
    from p2p_diloco.exchange.linkemu import EmulatedLink

    slow = SnapshotServer(config=NET, link=EmulatedLink(bandwidth_mbps=2.0))  # 400 kB: 1.6 s
    try:
        slow.publish({"phi": torch.ones(100_000)}, 1, 1000)
        worker = GossipWorker(NET, timeout_s=5.0)
        assert worker.progress() is None
        assert worker.start(_record(slow, 1))
        seconds, received, data_s, rate = _wait_for(lambda: (p := worker.progress()) and p[1] > 100_000 and p, 10, "bytes to arrive")
        assert 0 < seconds < 5 and received < 450_000 and 0 <= data_s < seconds
        assert rate != rate or 0.5 * 2e6 / 8 < rate < 2 * 2e6 / 8  # 2 Mbit/s, once a second chunk is in
        assert _result(worker).snapshot.version == 1 and worker.progress() is None
    finally:
        slow.close()


def test_a_running_fetch_given_up_ends_cancelled_and_the_server_serves_on():
    """`--exchange auto`: a whole state that will not fit the link is given up at its next chunk; the
    result says so (not a failure: the partner is not backed off), and the next fetch works."""
    from p2p_diloco.exchange.linkemu import EmulatedLink

    slow = SnapshotServer(config=NET, link=EmulatedLink(bandwidth_mbps=2.0))  # 400 kB: 1.6 s
    try:
        slow.publish({"phi": torch.ones(100_000)}, 1, 1000)
        worker = GossipWorker(NET, timeout_s=5.0)
        assert not worker.cancel()  # nothing runs
        assert worker.start(_record(slow, 1))
        _wait_for(lambda: (p := worker.progress()) and p[1] > 50_000, 10, "bytes to arrive")
        assert worker.cancel()
        result = _result(worker)
        assert result.cancelled and result.snapshot is None and result.error.startswith("FetchCancelled")
        assert result.seconds < 1.5
        assert worker.start(_record(slow, 1))
        assert _result(worker).snapshot.version == 1
    finally:
        slow.close()
