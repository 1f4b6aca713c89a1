"""Public states advanced by compressed updates (`core.public`) and served over the wire (protocol 1.1,
`hello.pub`): sender and receivers agree bit for bit, error feedback keeps the lag bounded, a client
gets the updates it lacks or the public state whole, and a 1.0 client still gets the state."""

from __future__ import annotations

import pytest
import torch

from p2p_diloco.config import NetworkConfig
from p2p_diloco.core.codecs import encoded_nbytes
from p2p_diloco.core.public import PublicCopies, PublicState, Update, worth_keeping
from p2p_diloco.errors import CodecError
from p2p_diloco.exchange import wire
from p2p_diloco.exchange.client import Fetcher
from p2p_diloco.exchange.public_views import PublicView
from p2p_diloco.exchange.server import SnapshotServer

pytestmark = pytest.mark.timeout(60)
N = 10_000


def _walk(steps: int, seed: int = 0):
    """An anchor that drifts as training moves it: a random walk."""
    g = torch.Generator().manual_seed(seed)
    anchor = torch.randn(N, generator=g)
    for _ in range(steps):
        anchor = anchor + 0.05 * torch.randn(N, generator=g)
        yield anchor


@pytest.mark.parametrize("codec", ["sign", "int4"])
def test_a_receiver_applying_the_updates_holds_the_senders_public_state_bit_for_bit(codec):
    start = torch.zeros(N)
    sender, copies = PublicState(start, codec), PublicCopies()
    copies.replace("s", sender.chain, 0, start)
    for anchor in _walk(12):
        sender.advance(anchor)
        copy = copies.advance("s", sender.chain, copies.held("s").version, sender.since(copies.held("s").version))
    assert copy.version == sender.version == 12 and torch.equal(copy.pub, sender.pub)
    lag = (anchor - sender.pub).norm() / anchor.norm()
    assert lag < (0.5 if codec == "sign" else 0.1)  # error feedback: what a message drops goes out later


def test_error_feedback_catches_up_with_an_anchor_that_stops():
    anchor = torch.randn(N, generator=torch.Generator().manual_seed(3))
    sender = PublicState(torch.zeros(N), "sign")
    gaps = []
    for _ in range(40):
        sender.advance(anchor)
        gaps.append(((anchor - sender.pub).norm() / anchor.norm()).item())
    assert gaps[-1] < 0.1 * gaps[0]


def test_a_sender_keeps_only_the_updates_cheaper_than_its_whole_public_state():
    assert worth_keeping(N, "sign") == 4 * N // encoded_nbytes(N, "sign") == 28
    sender = PublicState(torch.zeros(N), "int4")
    for anchor in _walk(12):
        sender.advance(anchor)
    keep = worth_keeping(N, "int4")
    assert len(sender.since(12 - keep)) == keep and sender.since(12 - keep - 1) is None
    assert sender.since(12) == [] and sender.since(13) is None


def test_updates_that_do_not_fit_the_copy_held_are_refused():
    sender, copies = PublicState(torch.zeros(N), "sign"), PublicCopies()
    for anchor in _walk(3):
        sender.advance(anchor)
    with pytest.raises(CodecError, match="do not apply"):
        copies.advance("s", sender.chain, 1, sender.since(1))  # nothing held
    copies.replace("s", "another-chain", 1, torch.zeros(N))
    with pytest.raises(CodecError, match="do not apply"):
        copies.advance("s", sender.chain, 1, sender.since(1))
    with pytest.raises(CodecError, match="sign or int4"):
        PublicState(torch.zeros(N), "int8")


def test_copies_are_bounded_least_recently_used_first():
    copies = PublicCopies(capacity=2)
    for peer in ("a", "b", "c"):
        copies.replace(peer, "x", 0, torch.zeros(4))
    assert copies.held("a") is None and copies.held("b") and copies.held("c")


def _view(sender: PublicState, version: int = 7) -> PublicView:
    return PublicView(chain=sender.chain, version=sender.version, pub=sender.pub.clone(), updates=tuple(sender.updates),
                      outer_version=version, tokens=1000, meta={"peer_id": "s"}, from_init=sender.from_init)


def test_a_client_gets_the_public_state_whole_then_only_the_updates_it_lacks():
    sender = PublicState(torch.randn(N), "sign")
    with SnapshotServer(config=NetworkConfig(compression="int8")) as server:
        server.publish({"phi": sender.pub}, version=7, tokens=1000)
        server.publish_public(_view(sender))
        copies = PublicCopies()
        with Fetcher(server.endpoint) as f:
            first = f.fetch(pub=True)  # holds nothing: the public state whole, exact
            assert set(first.tensors) == {"pub"} and first.meta["pub_chain"] == sender.chain
            assert "pub_from" not in first.meta and torch.equal(first.tensors["pub"], sender.pub)
            copies.replace("s", first.meta["pub_chain"], first.meta["pub_version"], first.tensors["pub"])
            for anchor in _walk(3):
                sender.advance(anchor)
            server.publish_public(_view(sender, version=10))
            held = copies.held("s")
            snap = f.fetch(pub=True, held=(held.chain, held.version), decode=False)
            assert list(snap.tensors) == ["u1", "u2", "u3"] and snap.meta["pub_from"] == 0 and snap.version == 10
            assert snap.nbytes < 3 * encoded_nbytes(N, "sign") + 3 * 64  # the updates only
            copy = copies.advance("s", snap.meta["pub_chain"], snap.meta["pub_from"], [Update(u) for u in snap.tensors.values()])
            assert torch.equal(copy.pub, sender.pub)
            again = f.fetch(pub=True, held=(copy.chain, copy.version))  # nothing new
            assert again.tensors == {} and again.meta["pub_from"] == 3
            stale = f.fetch(pub=True, held=("another-chain", 3))  # a restarted island's old chain
            assert set(stale.tensors) == {"pub"}
            state = f.fetch()  # a 1.0 client (no pub): the state as always
            assert set(state.tensors) == {"phi"} and "pub_chain" not in state.meta


def test_an_island_that_sends_whole_states_answers_pub_with_its_state():
    with SnapshotServer(config=NetworkConfig(compression="int8")) as server:
        server.publish({"phi": torch.ones(N)}, version=2, tokens=10)
        with Fetcher(server.endpoint) as f:
            snap = f.fetch(pub=True, held=("abc", 1))
        assert set(snap.tensors) == {"phi"} and "pub_chain" not in snap.meta


def test_hello_pub_fields_are_checked():
    ok = wire.encode(wire.Hello(rid=1, pub=True, chain="c", since=4))
    assert wire.decode_request(ok) == wire.Hello(rid=1, pub=True, chain="c", since=4)
    import msgpack

    for bad in ({"pub": 1}, {"chain": "c", "since": 1}, {"pub": True, "chain": "c"},
                {"pub": True, "chain": "c", "since": -1}, {"pub": True, "chain": "", "since": 1}):
        frames = [msgpack.packb({"v": list(wire.PROTOCOL_VERSION), "t": "hello", "rid": 5, "prefetch": 0,
                                 "chunk": 0, **bad})]
        with pytest.raises(wire.ProtocolError) as e:
            wire.decode_request(frames)
        assert e.value.rid == 5


def test_a_chain_that_starts_at_the_initial_weights_costs_a_newcomer_only_the_updates():
    initial = torch.randn(N, generator=torch.Generator().manual_seed(5))
    fresh, joined = PublicState(initial, "sign", from_init=True), PublicState(initial + 1, "sign")
    for anchor in _walk(2):
        fresh.advance(anchor)
        joined.advance(anchor)
    copies = PublicCopies(initial=initial.clone())
    assert copies.asking("s") == ("init", 0)
    with SnapshotServer(config=NetworkConfig(compression="int8")) as server:
        server.publish({"phi": initial}, version=2, tokens=10)
        server.publish_public(_view(fresh))
        with Fetcher(server.endpoint) as f:
            snap = f.fetch(pub=True, held=copies.asking("s"), decode=False)
            assert list(snap.tensors) == ["u1", "u2"] and snap.meta["pub_chain"] == fresh.chain
            copy = copies.advance("s", fresh.chain, 0, [Update(u) for u in snap.tensors.values()])
            assert torch.equal(copy.pub, fresh.pub) and copies.asking("s") == (fresh.chain, 2)
            server.publish_public(_view(joined))  # a chain that started elsewhere: whole
            assert set(f.fetch(pub=True, held=("init", 0)).tensors) == {"pub"}


@pytest.mark.parametrize("numel", [1000, 842_000])
def test_the_bytes_of_a_public_state_fetch_are_what_the_simulator_charges(numel):
    """`exchange.cost.public_fetch_wire_bytes` is, byte for byte, what fetching updates (from `INIT`
    or from a copy held) or a whole public state moves (the chain id and digests of the same length)."""
    from p2p_diloco.exchange.cost import REPRESENTATIVE_META, public_fetch_wire_bytes

    initial = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    sender = PublicState(initial, "sign", from_init=True)
    for k in range(3):
        sender.advance(initial + 0.1 * (k + 1))
    view = PublicView(chain=sender.chain, version=3, pub=sender.pub, updates=tuple(sender.updates), outer_version=1,
                      tokens=1, meta=REPRESENTATIVE_META, digest="0" * 16, from_init=True)
    for held, start in ((("init", 0), 0), ((sender.chain, 2), 2), (None, None)):
        with SnapshotServer(config=NetworkConfig()) as server, Fetcher(server.endpoint) as f:  # a link not measured yet
            server.publish_public(view)
            snap = f.fetch(pub=True, held=held, decode=False)
            assert snap.wire_bytes == public_fetch_wire_bytes(numel, "sign", start, 3, held), held


def test_a_server_keeps_old_answers_within_a_bound():
    from p2p_diloco.exchange import public_views
    from p2p_diloco.exchange.public_views import PublicViews

    sender, views = PublicState(torch.zeros(N), "sign"), PublicViews()
    sids = []
    for k in range(6):  # each publish: a client with an old chain gets the whole state (4 N bytes)
        sender.advance(torch.full((N,), float(k + 1)))
        views.publish(_view(sender))
        sids.append(views.answer(wire.Hello(rid=1, pub=True)).manifest.sid)
    kept = [sid for sid in sids if views.by_sid(sid) is not None]
    assert sids[-1] in kept and len(kept) <= 3  # the current one, and two whole states' worth of old ones
    assert public_views.KEEP_PACKED >= len(kept)


def test_a_whole_answer_is_packed_from_a_public_state_that_does_not_change_under_it():
    """The island applies an update in place under `changing()`: a client asking for the public state
    whole meanwhile waits, then gets the state after the update, labelled with its version."""
    import threading

    from p2p_diloco.exchange.public_views import PublicViews

    def view() -> PublicView:  # (as the island's: the public state itself, not a copy)
        return PublicView(chain=sender.chain, version=sender.version, pub=sender.pub, updates=tuple(sender.updates),
                          outer_version=sender.version, tokens=1, meta={"peer_id": "s"})

    sender, views = PublicState(torch.zeros(N), "sign"), PublicViews()
    views.publish(view())
    answers = []
    with views.changing():
        asker = threading.Thread(target=lambda: answers.append(views.answer(wire.Hello(rid=1, pub=True))))
        asker.start()
        asker.join(0.3)
        assert asker.is_alive()  # it waits for the change to end
        pub_before = sender.pub
        sender.advance(torch.full((N,), 2.0))
        assert sender.pub is pub_before  # (changed in place: no new state-sized tensor per round)
        views.publish(view())
    asker.join(10)
    (answer,) = answers
    assert answer.manifest.meta["pub_version"] == sender.version == 1
    (spec,) = answer.manifest.tensors
    got = torch.frombuffer(bytearray(answer.view[spec.offset:spec.offset + spec.nbytes]), dtype=torch.float32)
    assert torch.equal(got, sender.pub) and not torch.equal(got, torch.zeros(N))


def test_fragments_keep_the_senders_and_receivers_public_states_equal_and_an_answer_fits_the_wire():
    from p2p_diloco.core.public import MAX_KEPT, parse_update_names
    from p2p_diloco.exchange.manifest import MAX_TENSORS

    start = torch.zeros(N)
    sender, copies = PublicState(start, "sign"), PublicCopies()
    copies.replace("s", sender.chain, 0, start)
    for k, anchor in enumerate(_walk(12)):
        sender.advance(anchor, parts=(1, 4, 16)[k % 3])  # `auto` may change the fragments at any update
    copy = copies.advance("s", sender.chain, 0, sender.since(0))
    assert torch.equal(copy.pub, sender.pub) and sender.parts == 16
    for anchor in _walk(200, seed=1):
        sender.advance(anchor, parts=16)  # small updates: the wire's bound on tensors, not bytes, holds them
    assert len(sender.updates) == MAX_KEPT < MAX_TENSORS
    assert parse_update_names(["u4@250", "u5"], 3) == [250, 0]
    for bad in (["u5@250"], ["u4@x"], ["u4@-1"]):
        with pytest.raises(CodecError, match="expected"):
            parse_update_names(bad, 3)
