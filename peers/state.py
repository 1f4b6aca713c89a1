"""Where an island's state comes from when it starts: its last checkpoint, or the freshest member.

A joiner never starts from the initial weights in a running swarm: it downloads the freshest
member's state (trying the next freshest when a download fails). `--resume` continues from the
last checkpoint in the run folder instead, with everything the island had: outer state, inner
optimizer, scheduler, model buffers and the caller's own state (`SwarmIsland.save_checkpoint`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from p2p_diloco.errors import CheckpointError, TransportError
from p2p_diloco.exchange.client import fetch
from p2p_diloco.peers import checkpoint
from p2p_diloco.peers.gossip import partner_state

log = logging.getLogger(__name__)
DISCOVERY_SETTLE_S = 5.0
"""How long a joiner lets discovery show who is there (a second island at least) before it looks
for the freshest member."""


class ModelExtras:
    """The model's state that never travels: buffers and frozen parameters (checkpointed, not averaged)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.state_dict().items() if k not in self._trainable}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise CheckpointError(f"the model's buffers differ from the checkpoint's: "
                                  f"{sorted(set(state) ^ expected)[:4]}")
        self.model.load_state_dict(state, strict=False)


def resume(island: Any) -> int:
    """Continue from the last checkpoint in the run folder; returns its round (`CheckpointError`
    if there is none, it is damaged, or it belongs to another model)."""
    folder = island.cfg.run_dir / "checkpoints"
    path = checkpoint.latest(folder)
    if path is None:
        raise CheckpointError(f"--resume given but {folder} holds no checkpoint")
    meta = checkpoint.restore(island.outer, island._parts(), checkpoint.load(path), path, island.fingerprint)
    island.own_tokens = int(meta.get("own_tokens", 0))
    island.run_digest = island.publisher.meta["run"] = str(meta.get("run", island.run_digest))
    log.info("resumed from %s at version %d, round %d", path.name, island.version, int(meta["round"]))
    return int(meta["round"])


def join_from_freshest(island: Any) -> None:
    """Start from the freshest member's state if the run is already going (see the module docstring)."""
    cfg, outer = island.cfg, island.outer
    deadline = time.monotonic() + cfg.join_timeout_s
    island.wait_for_members(2, min(DISCOVERY_SETTLE_S, cfg.join_timeout_s))  # who is there?
    tried: set[str] = set()
    while time.monotonic() < deadline and not island._stop_asked:
        others = {p: r for p, r in island.membership.members().items() if p != island.peer_id and p not in tried
                  and r.state in ("training", "syncing") and (not r.model or r.model == island.fingerprint)}
        if not others:
            return  # nobody trains yet: this island starts the run (all islands share the initial weights)
        best = max(others.values(), key=lambda r: (r.version, r.tokens))
        if best.version <= outer.state.version:
            return
        island.state = "syncing"
        tried.add(best.peer_id)
        try:
            snap = fetch(best.endpoint, island.network, decode=False,
                         timeout=min(island.network.fetch_timeout_s, deadline - time.monotonic()))
            outer.adopt(partner_state(snap, outer.state.phi.numel(), island.fingerprint, island.run_digest))
            island.bytes_in += snap.nbytes
            log.info("joined from %s at version %d (%d bytes in %.1f s)", best.peer_id[:8], snap.version,
                     snap.nbytes, snap.seconds)
            return
        except TransportError as e:
            log.info("could not download the state of %s: %s; trying another member", best.peer_id[:8], e)
    log.warning("no member's state could be downloaded; starting from the initial weights")
