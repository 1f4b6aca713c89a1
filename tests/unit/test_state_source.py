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
from p2p_diloco.peers.state import StateSource

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
