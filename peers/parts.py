"""How an island builds the parts that a test or a benchmark may build otherwise.

`SwarmIsland` takes one `IslandParts` and builds every part through it, so that fault injection
(`bench.member`: a member honest but for what it publishes) enters through the island's own
construction and every part of it (its rounds, its checks, its gossip worker) holds the same
objects; nothing is swapped in afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from p2p_diloco.admission import AdmissionConfig
from p2p_diloco.peers.gossip.publishing import Publisher
from p2p_diloco.peers.reports.sinks import SinkFactory
from p2p_diloco.peers.reports.trackers import build_sinks
from p2p_diloco.tracking import LogConfig

if TYPE_CHECKING:
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.core.modes import Exchange
    from p2p_diloco.exchange.server import SnapshotServer
    from p2p_diloco.peers.admission.protocol import Check
    from p2p_diloco.peers.identity import Identity

PublisherFactory = Callable[["SnapshotServer", "OuterLoop", "Exchange", "Identity"], Publisher]


@dataclass(frozen=True)
class IslandParts:
    """The factories and settings an island is built from."""

    publisher: PublisherFactory = Publisher
    """Builds what publishes the island's state (`peers.gossip.publishing.Publisher`)."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """The checks partners' states get, in order, and their settings (`peers.admission`)."""
    checks: Sequence[Check] = ()
    """More checks, after the configured ones: fault injection's watchers of what the island admits."""
    log: LogConfig = field(default_factory=LogConfig)
    """Where each round's figures go besides `metrics.jsonl` (`join --log-to`, the config file's `[log]`)."""
    sinks: SinkFactory = build_sinks
    """Builds the sinks those figures go to (`peers.reports.sinks`: TensorBoard, W&B)."""
