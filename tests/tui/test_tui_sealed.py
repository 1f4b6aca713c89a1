"""The dashboard's source watching a run whose records are sealed with a secret it was not given."""

from __future__ import annotations

import threading

from p2p_diloco.tui.source import MembershipSource

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery.membership import SEALED_HINT, Membership
from p2p_diloco.discovery.records import IslandRecord


class Blind(Membership):
    """A member without the secret: it sees `hidden` sealed records and the plain ones it is given."""

    kind = "zmq"
    peer_id = "blind"

    def __init__(self, hidden: int, records: dict) -> None:
        self.hidden, self.records = hidden, records

    def sealed_hidden(self) -> int:
        return self.hidden

    def announce(self, record) -> None: ...
    def members(self) -> dict:
        return dict(self.records)

    def refresh(self, timeout: float = 10.0) -> dict:
        return self.members()

    def leave(self) -> None: ...
    def shutdown(self) -> None: ...


def first_reading(membership: Membership):
    got, done = [], threading.Event()

    def deliver(snap):
        if snap.status != "connecting":
            got.append(snap)
            done.set()

    source = MembershipSource(DiscoveryConfig(run_id="sealed", poll=0.05), opener=lambda cfg, observer: membership)
    source.start(deliver)
    assert done.wait(5)
    source.stop()
    return got[0]


def test_a_sealed_run_reads_as_disconnected_and_says_why():
    snap = first_reading(Blind(hidden=2, records={}))
    assert snap.status == "disconnected" and snap.records is None and snap.detail == SEALED_HINT


def test_plain_records_beside_sealed_ones_are_shown():
    rec = IslandRecord(peer_id="plain", endpoint="tcp://127.0.0.1:1")
    snap = first_reading(Blind(hidden=2, records={"plain": rec}))
    assert snap.status == "connected" and snap.records == {"plain": rec}
