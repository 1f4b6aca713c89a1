"""Where a joining or stale island downloads the swarm's state from: a member nobody can dial is
fetched through the bootstrap's relay, over real sockets on 127.0.0.1."""

from __future__ import annotations

import pytest
import torch

from p2p_diloco.config import DiLoCoConfig, NetworkConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.params import fingerprint, weights_digest
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.exchange import payload
from p2p_diloco.exchange.client import Fetcher
from p2p_diloco.exchange.server import SnapshotServer
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.state.source import StateSource

pytestmark = pytest.mark.timeout(60)
UNREACHABLE = "tcp://127.0.0.1:9"
"""An outbound-only member's own endpoint: nothing answers there."""


def _source(relay: str | None) -> tuple[StateSource, Identity]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    outer = OuterLoop("joiner", model, DiLoCoConfig())
    me = Identity("joiner", "joiner", fingerprint(model), weights_digest(outer.state.phi))
    network = NetworkConfig(fetch_timeout_s=3.0)
    return StateSource(me, outer, membership=None, network=network, secret=None, stopped=lambda: False,
                       relay=relay), me


def test_an_outbound_only_members_state_is_downloaded_through_the_relay():
    relay = SnapshotServer(config=NetworkConfig(), relay=True)
    try:
        source, me = _source(relay.endpoint)
        theirs = source.outer.state.phi + 0.01
        manifest, buf = payload.pack({"phi": theirs}, "fp32", version=7, tokens=70,
                                     meta=Identity("alpha", "alpha", me.model, me.run).meta())
        with Fetcher(relay.endpoint) as f:  # what an outbound-only island does after each publish
            f.push(manifest, memoryview(buf.numpy()), timeout=5)
        record = IslandRecord(peer_id="alpha", endpoint=UNREACHABLE, reach="outbound", version=7)
        (got,) = source.download([record], within_s=10)
        assert got.record.peer_id == "alpha" and got.state.version == 7
        assert torch.equal(got.state.phi.float(), theirs)
        # without a relay such a member is not tried at all (its own endpoint answers nobody)
        assert _source(None)[0].download([record], within_s=10) == []
    finally:
        relay.close()


class _Listing:
    """The members discovery lists (`Membership.members`)."""

    def __init__(self, records: list[IslandRecord]) -> None:
        self.records = {r.peer_id: r for r in records}

    def members(self) -> dict[str, IslandRecord]:
        return self.records


def test_a_catch_up_counts_the_member_whose_state_was_ahead_whatever_its_record_says():
    """A record is republished less often than a state: the member whose state at version 8 showed this
    island (at 5) behind may still be listed at 5, and a catch-up that read only the records found
    nobody ahead and downloaded nothing."""
    source, _ = _source(None)
    source.outer.state.version = 5
    listed = (("alpha", 5), ("beta", 9), ("gamma", 3), ("joiner", 9))  # (this island is listed too)
    source.membership = _Listing([IslandRecord(peer_id=p, endpoint=UNREACHABLE, version=v, state="training")
                                  for p, v in listed])
    assert [r.peer_id for r in source.freshest()] == ["beta"]
    assert [r.peer_id for r in source.freshest(ahead="alpha")] == ["beta", "alpha"]
