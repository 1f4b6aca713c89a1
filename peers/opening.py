"""An island's way in: its run directory taken, its server listening, its reach known, discovery joined.

`open_island` does these in order and undoes what it did when one fails (an earlier run's
checkpoints are resumed or moved aside, never overwritten: `peers.state.rundir`; a tracker asked
for and not installed stops it before any socket opens); `Opened.close` undoes them all when
the island is built no further. The island (`peers.island.SwarmIsland`) leaves through the same parts,
each step on its own (`leave`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from p2p_diloco.config import DiscoveryConfig, IslandConfig, NetworkConfig
from p2p_diloco.discovery import open_membership
from p2p_diloco.discovery.membership import Membership
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.exchange.server import SnapshotServer
from p2p_diloco.peers.gossip.reach import PushInbox, Reach, check_reach
from p2p_diloco.peers.state.rundir import RunDirLock, prepare_run_dir
from p2p_diloco.tracking import LogConfig, require_trackers

log = logging.getLogger(__name__)


@dataclass
class Opened:
    """What `open_island` opened."""

    run_dir: RunDirLock
    server: SnapshotServer
    reach: Reach
    membership: Membership
    discovery: DiscoveryConfig
    """The discovery settings as the island joined with them (an outbound-only island's DHT node is a client)."""

    def close(self) -> None:
        self.membership.shutdown(), self.server.close(), self.run_dir.release()


def open_island(cfg: IslandConfig, discovery: DiscoveryConfig, network: NetworkConfig, log: LogConfig,
                inbox: PushInbox, link: EmulatedLink | None, stopped: Callable[[], bool]) -> Opened:
    """Take the run directory, listen, learn who can dial this island, and join discovery."""
    run_dir = RunDirLock(cfg.run_dir)  # one island per run directory
    try:
        prepare_run_dir(cfg.run_dir, resume=cfg.resume, fresh=cfg.fresh)
        require_trackers(log.to)
    except BaseException:
        run_dir.release()
        raise
    server = SnapshotServer(f"tcp://{discovery.host}:{cfg.port}", network, secret=discovery.secret,
                            announce_host=discovery.announce_host, pushes=inbox, link=link)
    try:  # who can dial us decides how discovery runs
        reach = check_reach(cfg, discovery, server.endpoint)
        if reach.mode == "outbound":
            discovery = dataclasses.replace(discovery, outbound_only=True)
        membership = open_membership(discovery, budget_s=cfg.max_seconds, stopped=stopped)
    except BaseException:
        server.close(), run_dir.release()
        raise
    return Opened(run_dir, server, reach, membership, discovery)


def leave(steps: Sequence[tuple[str, Callable[[], object]]], saving: Collection[str] = ()) -> None:
    """Take the named steps of leaving in order, each on its own: leaving must not fail half-way, so
    an error is logged and the next step runs. A second Ctrl+C (any other `BaseException`) skips the
    `saving` steps still to come, still stops the DHT process and closes the sockets, and is raised
    at the end."""
    interrupted: BaseException | None = None
    for name, step in steps:
        if interrupted is not None and name in saving:
            continue
        try:
            step()
        except Exception:
            log.exception("while leaving: %s failed", name)
        except BaseException as e:
            interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted
