"""How an island builds the parts that a test or a benchmark may build otherwise.

`SwarmIsland` takes one `IslandParts` and builds every part through it, so that fault injection
(`bench.member`: a member honest but for what it publishes) enters through the island's own
construction and every part of it (its rounds, its checks, its gossip worker) holds the same
objects; nothing is swapped in afterwards. `IslandParts.partner_side` wires the parts that deal
with other islands (publishing, fetching, choosing, admitting, the rounds that mix) to each other;
the island keeps the user's side (`peers.island`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from p2p_diloco.admission import AdmissionConfig
from p2p_diloco.peers.admission.admission import Admission
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.registry import build_checks
from p2p_diloco.peers.admission.trust import share, standing
from p2p_diloco.peers.gossip.measure import measure
from p2p_diloco.peers.gossip.partners import PartnerChooser
from p2p_diloco.peers.gossip.publishing import Publisher
from p2p_diloco.peers.gossip.worker import GossipWorker
from p2p_diloco.peers.reports.sinks import SinkFactory
from p2p_diloco.peers.reports.trackers import build_sinks
from p2p_diloco.peers.rounds.alone import AloneWatch
from p2p_diloco.peers.rounds.divergence import DivergenceGuard
from p2p_diloco.peers.rounds.schedule import Rounds
from p2p_diloco.peers.rounds.tally import Tally
from p2p_diloco.peers.state.source import STALE_LAG, CatchingUp, StateSource
from p2p_diloco.tracking import LogConfig

if TYPE_CHECKING:
    import torch

    from p2p_diloco.config import DiLoCoConfig, IslandConfig, NetworkConfig
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.core.modes import Exchange
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.exchange.linkemu import EmulatedLink
    from p2p_diloco.exchange.server import SnapshotServer
    from p2p_diloco.peers.admission.protocol import Check
    from p2p_diloco.peers.gossip.reach import PushInbox
    from p2p_diloco.peers.identity import Identity
    from p2p_diloco.peers.opening import Opened

PublisherFactory = Callable[["SnapshotServer", "OuterLoop", "Exchange", "Identity"], Publisher]


class PartnerSide(NamedTuple):
    """The parts of an island that deal with other islands, wired to each other."""

    publisher: Publisher
    source: StateSource
    guard: DivergenceGuard
    gossip: GossipWorker
    chooser: PartnerChooser
    catching_up: CatchingUp
    admission: Admission
    tally: Tally
    alone: AloneWatch
    rounds: Rounds


@dataclass(frozen=True)
class IslandParts:
    """The factories and settings an island is built from."""

    publisher: PublisherFactory = Publisher
    """Builds what publishes the island's state (`peers.gossip.publishing.Publisher`)."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """The checks partners' states get, in order, and their settings (`peers.admission`)."""
    checks: Sequence[Check] = ()
    """More checks, after the configured ones: fault injection's watchers of what the island admits."""
    ledger: Callable[[str], PartnerLedger] = PartnerLedger
    """Builds the island's memory of its partners, from its name (`peers.admission.ledger`; fault
    injection's liars tell other records of them)."""
    log: LogConfig = field(default_factory=LogConfig)
    """Where each round's figures go besides `metrics.jsonl` (`join --log-to`, the config file's `[log]`)."""
    sinks: SinkFactory = build_sinks
    """Builds the sinks those figures go to (`peers.reports.sinks`: TensorBoard, W&B)."""

    def partner_side(self, opened: Opened, identity: Identity, outer: OuterLoop, *, diloco: DiLoCoConfig,
                     network: NetworkConfig, island: IslandConfig, exchange: Exchange,
                     optimizer: torch.optim.Optimizer, scheduler: Any, inbox: PushInbox, link: EmulatedLink | None,
                     probe_fn: Callable[[], Any] | None, stopped: Callable[[], bool]) -> PartnerSide:
        """Build the partner side around the island's opened sockets and membership (`peers.opening`),
        its identity and its outer loop; `stopped()` says the island was asked to stop, `probe_fn`
        is the effect probe's held-out loss."""
        server, reach, membership, secret = opened.server, opened.reach, opened.membership, opened.discovery.secret
        publisher = self.publisher(server, outer, exchange, identity)
        source = StateSource(identity, outer, membership, network, secret, stopped, relay=reach.relay)
        gossip = GossipWorker(network, secret=secret, timeout_s=network.fetch_timeout_s,
                              measure=lambda snap: measure(outer.state.phi, snap.tensors["phi"],
                                                           outer.state.m, snap.tensors.get("m")),
                              push_source=server.latest if reach.mode == "outbound" else None,
                              relay=reach.relay, link=link, **publisher.public_side.partner_copies())
        ledger, trust = self.ledger(identity.name), self.admission.trust

        def kept(peer: str, members: Mapping[str, IslandRecord]) -> float:  # (what a partner's record leaves it: `trust`)
            return share(standing(peer, ledger, members, trust), trust.slack)
        chooser = PartnerChooser(identity.peer_id, diloco.max_staleness, model=identity.model,
                                 relay=reach.relay is not None, rng=random.Random(identity.peer_id),
                                 ring=exchange.ring, share=kept if "trust" in self.admission.checks else lambda peer, members: 1.0)
        catching_up = CatchingUp(identity.name, source, publisher.public_side.restart)
        checks = build_checks(self.admission, outer, probe_fn, self.checks)
        admission = Admission(checks, identity, outer, chooser, publisher, membership.members, ledger,
                              stale_lag=STALE_LAG, catch_up=lambda peer, v: catching_up.start(peer, v, rounds.label(peer)))
        guard = DivergenceGuard(identity.name, outer, optimizer, scheduler, on_blame=admission.refuse)
        tally = Tally()
        alone = AloneWatch(identity.name, bootstrap=bool(opened.discovery.bootstrap),
                           outbound=reach.mode == "outbound", relay=reach.relay is not None)
        rounds = Rounds(identity=identity, outer=outer, diloco=diloco, island=island, network=network,
                        membership=membership, gossip=gossip, chooser=chooser, admission=admission,
                        catching_up=catching_up, inbox=inbox, publisher=publisher, tally=tally, alone=alone,
                        stopped=stopped)
        return PartnerSide(publisher, source, guard, gossip, chooser, catching_up, admission, tally, alone, rounds)
