"""The receiving side of pushes inside an island (`peers.gossip.reach.PushInbox`): who may push, how many,
and how a pushed state is handed to the round, measured like a fetched one."""

from __future__ import annotations

import time

import pytest
import torch

from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.exchange import payload
from p2p_diloco.exchange.push import Pushed
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.gossip.reach import Door, PushInbox

pytestmark = pytest.mark.timeout(30)


def _inbox(excluded=(), **members):
    records = {pid: IslandRecord(peer_id=pid, endpoint="tcp://10.0.0.9:7000", version=3, tokens=10, reach=reach)
               for pid, reach in members.items()}
    inbox = PushInbox()
    inbox.door = Door(Identity("me", "me", "f" * 16, "r" * 16), lambda: records, lambda peer: peer in excluded,
                      lambda snap: 0.25)
    return inbox


def _manifest(peer="nat", model="f" * 16, run="r" * 16):
    return payload.pack({"phi": torch.ones(1000)}, "int8", version=3, tokens=10,
                        meta={"peer_id": peer, "model": model, "run": run})


def test_only_outbound_only_members_of_this_model_and_run_may_push():
    excluded = set()
    inbox = _inbox(excluded, nat="outbound", pub="direct")
    assert inbox.admit(_manifest("pub")[0]) == ("refused", "pushes are taken only from members that run outbound-only")
    assert inbox.admit(_manifest("stranger")[0])[0] == "refused"  # not a member at all
    assert "another model" in inbox.admit(_manifest(model="0" * 16)[0])[1]
    assert "another run" in inbox.admit(_manifest(run="0" * 16)[0])[1]
    excluded.add("nat")
    assert "refused too often" in inbox.admit(_manifest()[0])[1]


def test_one_pushed_state_per_round_then_busy_and_a_failed_push_frees_the_room():
    inbox = _inbox(nat="outbound", other="outbound")
    manifest, buf = _manifest()
    assert inbox.admit(manifest) is None
    assert inbox.admit(_manifest("other")[0])[0] == "busy"  # one already on its way
    inbox.dropped(manifest)  # it failed (bad bytes, a vanished sender): room again
    assert inbox.admit(manifest) is None
    asm = payload.Assembler(manifest, keep_encoded=True)
    asm.accept(0, memoryview(buf.numpy()))
    inbox.stored(Pushed(manifest=manifest, tensors=asm.result(), raw=asm.raw, address="10.0.0.9", seconds=0.1))
    deadline = time.monotonic() + 5
    while not inbox.has_result:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    result = inbox.take()
    assert result.pushed and result.peer_id == "nat" and result.measured == 0.25 and result.snapshot.version == 3
    assert inbox.admit(_manifest("other")[0])[0] == "busy"  # this round took one already
    inbox.new_round()
    assert inbox.admit(_manifest("other")[0]) is None


def test_nothing_is_taken_before_the_island_has_started():
    assert PushInbox().admit(_manifest()[0])[0] == "busy"


def _push_and_take(inbox, peer):
    manifest, buf = _manifest(peer)
    assert inbox.admit(manifest) is None
    asm = payload.Assembler(manifest, keep_encoded=True)
    asm.accept(0, memoryview(buf.numpy()))
    inbox.stored(Pushed(manifest=manifest, tensors=asm.result(), raw=asm.raw, address="10.0.0.9", seconds=0.1))
    deadline = time.monotonic() + 5
    while not inbox.has_result:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert inbox.take().peer_id == peer
    inbox.new_round()


def test_a_faster_pusher_cannot_starve_another():
    """The member taken last waits while another one turned away waits too; alone, it is taken again."""
    inbox = _inbox(fast="outbound", slow="outbound")
    _push_and_take(inbox, "fast")
    _push_and_take(inbox, "fast")  # nobody else asked: the same member again
    manifest, _ = _manifest("fast")
    assert inbox.admit(manifest) is None  # on its way, so the slow one is turned away...
    assert inbox.admit(_manifest("slow")[0])[0] == "busy"
    inbox.dropped(manifest)
    assert inbox.admit(manifest) == ("busy", "this island took this member's state last; another member's turn")
    _push_and_take(inbox, "slow")  # ... and its turn comes next
    _push_and_take(inbox, "fast")
