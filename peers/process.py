"""The island process: signals, torchrun ranks, and an island's life from start to leave.

`run_island` is what `p2p-diloco join` calls. Rank 0 of a torchrun group (or a plain process) runs
an `IslandRunner`: resume or join, train rounds, finish; SIGINT and SIGTERM are routed to its stop
flag, so the island stops after the current inner step, checkpoints, leaves and exits 130 / 143.
The other ranks only follow rank 0's commands (`p2p_diloco.peers.distributed`).
"""

from __future__ import annotations

import logging
import signal
import time

from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, ModelConfig, NetworkConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler, load_corpus
from p2p_diloco.core.island import Island
from p2p_diloco.errors import CheckpointError, TransportError
from p2p_diloco.exchange.client import fetch
from p2p_diloco.peers import checkpoint
from p2p_diloco.peers.distributed import IntraIsland, follow
from p2p_diloco.peers.gossip import partner_state
from p2p_diloco.peers.runner import IslandRunner, initial_model

log = logging.getLogger(__name__)
DISCOVERY_SETTLE_S = 5.0
"""How long a joiner lets discovery show who is there (a second island at least) before it looks
for the freshest member."""


def run_island(cfg: IslandConfig, model_cfg: ModelConfig, train: TrainConfig, diloco: DiLoCoConfig,
               network: NetworkConfig, discovery: DiscoveryConfig, data: str | None = None) -> tuple[int, dict]:
    """Run one island until a limit or a signal. Returns (exit code, summary)."""
    group = IntraIsland.from_env()
    if group is not None and group.rank > 0:
        try:
            return _run_follower(group, model_cfg, train, diloco, data), {}
        finally:
            group.close()
    runner = IslandRunner(cfg, model_cfg, train, diloco, network, discovery, data, group)
    previous = {sig: signal.signal(sig, runner.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if cfg.resume:
            resume(runner)
        else:
            join_from_freshest(runner)
        code = runner.train()
    finally:
        summary = runner.finish()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if group is not None:
            group.close()
    return code, summary


def _run_follower(group: IntraIsland, model_cfg: ModelConfig, train: TrainConfig, diloco: DiLoCoConfig,
                  data: str | None) -> int:
    corpus = load_corpus(data)
    model = initial_model(model_cfg, train, group)
    seed = group.share_seed(0)
    sampler = BatchSampler(corpus.train, model_cfg.resolved()["block_size"], train.batch_size, seed)
    return follow(group, Island(f"rank-{group.rank}", model, train, diloco, sampler))


def resume(runner: IslandRunner) -> None:
    """Continue from the last checkpoint in the run folder (`CheckpointError` if there is none)."""
    path = checkpoint.latest(runner.cfg.run_dir / "checkpoints")
    if path is None:
        raise CheckpointError(f"--resume given but {runner.cfg.run_dir / 'checkpoints'} holds no checkpoint")
    runner.round = checkpoint.restore_island(runner.island, checkpoint.load(path), path)
    log.info("resumed from %s at version %d, round %d", path.name, runner.island.state.version, runner.round)


def join_from_freshest(runner: IslandRunner) -> None:
    """Start from the freshest member's state if the run is already going: a joiner never starts
    from the initial weights in a running swarm (it tries the next freshest when a download fails)."""
    cfg, isl = runner.cfg, runner.island
    deadline = time.monotonic() + cfg.join_timeout_s
    runner.wait_for_members(2, min(DISCOVERY_SETTLE_S, cfg.join_timeout_s))  # who is there?
    tried: set[str] = set()
    while time.monotonic() < deadline and not runner.stop.signum:
        others = {p: r for p, r in runner.membership.members().items() if p != runner.peer_id and p not in tried
                  and r.state in ("training", "syncing")}
        if not others:
            return  # nobody trains yet: this island starts the run (all islands share the init seed)
        best = max(others.values(), key=lambda r: (r.version, r.tokens))
        if best.version <= isl.state.version:
            return
        runner.state = "syncing"
        tried.add(best.peer_id)
        try:
            snap = fetch(best.endpoint, runner.network,
                         timeout=min(runner.network.fetch_timeout_s, deadline - time.monotonic()))
            isl.adopt(partner_state(snap, isl.state.phi.numel()))
            runner.bytes_in += snap.nbytes
            log.info("joined from %s at version %d (%d bytes in %.1f s)", best.peer_id[:8], snap.version,
                     snap.nbytes, snap.seconds)
            return
        except TransportError as e:
            log.info("could not download the state of %s: %s; trying another member", best.peer_id[:8], e)
    log.warning("no member's state could be downloaded; starting from the initial weights")
