"""Where an island's state comes from when it starts: its last checkpoint, or the freshest member.

A joiner never starts from the initial weights in a running swarm: it downloads the states of
the freshest members (up to three) and adopts the one that agrees best with the others. `--resume` continues from the
last checkpoint in the run folder instead, with everything the island had: outer state, inner
optimizer, scheduler, model buffers and the caller's own state (`SwarmIsland.save_checkpoint`).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any

import torch

from p2p_diloco.errors import CheckpointError, TransportError
from p2p_diloco.exchange.client import fetch
from p2p_diloco.peers import checkpoint
from p2p_diloco.peers.gossip import partner_state
from p2p_diloco.peers.plausibility import START_BOUND, distance, norm

log = logging.getLogger(__name__)
JOIN_QUORUM = 3
"""A joiner compares up to this many of the freshest members' states before adopting one."""
CATCH_UP_S = 300.0
"""A catch-up's downloads run this long at most (the island trains on meanwhile)."""
STALE_LAG = 3
"""A member this many versions ahead or more means this island is the stale one: it catches up
(its partners' states would be refused as implausibly far from its own)."""
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


def join_from_freshest(island: Any, lead: int = 1) -> None:
    """Start from the freshest members' state if the run is already going (see the module docstring).

    `lead`: how many versions ahead the freshest member must be. A resumed island passes
    `STALE_LAG`: a checkpoint the swarm has left that far behind would see every partner's state
    refused as too far until a catch-up landed (in a test, a whole run of rounds without a
    partner), so it joins as a newcomer does, keeping its inner optimizer and data position.

    The joiner downloads up to `JOIN_QUORUM` of the freshest members' states (same model and run)
    and adopts the one closest to the others, so one member publishing a poisoned state while it
    claims the highest version cannot hand every newcomer its poison; with two, the one closer to
    the run's initial weights (this island's own) wins.
    """
    island.wait_for_members(2, min(DISCOVERY_SETTLE_S, island.cfg.join_timeout_s))  # who is there?
    if (others := _freshest(island)) and others[0].version >= island.version + lead:
        island.state = "syncing"
        adopt_most_central(island, download_freshest(island, others, island.cfg.join_timeout_s))


def _freshest(island: Any) -> list:
    """The members ahead of this island (same model), freshest first."""
    return sorted((r for p, r in island.membership.members().items()
                   if p != island.peer_id and r.state in ("training", "syncing") and r.version > island.version
                   and (not r.model or r.model == island.fingerprint)),
                  key=lambda r: (r.version, r.tokens), reverse=True)


def download_freshest(island: Any, others: list, within_s: float) -> list:
    """Download up to `JOIN_QUORUM` of the states of `others` (`_freshest`, in order), checked against
    this model and run, within `within_s`. Touches no island state: a catching-up island runs it on a
    thread."""
    deadline = time.monotonic() + within_s
    states = []
    for rec in others:
        if len(states) >= JOIN_QUORUM or time.monotonic() >= deadline or island._stop_asked:
            break
        try:
            snap = fetch(rec.endpoint, island.network, decode=False,
                         timeout=min(island.network.fetch_timeout_s, deadline - time.monotonic()))
            states.append((rec, partner_state(snap, island.outer.state.phi.numel(), island.fingerprint,
                                              island.run_digest), snap))
        except TransportError as e:
            log.info("could not download the state of %s: %s; trying another member", rec.peer_id[:8], e)
    return states


def adopt_most_central(island: Any, states: list) -> None:
    """Adopt the downloaded state that agrees best with the others (`_most_central`)."""
    if not states:
        log.warning("no member's state could be downloaded; %s", "keeping this island's own" if island.round
                    else "starting from the initial weights")
        return
    island.bytes_in += sum(snap.wire_bytes for _, _, snap in states)
    rec, state, snap = _most_central(states, island.outer.state.phi)
    island.outer.adopt(state)
    log.info("joined from %s at version %d (%d bytes in %.1f s; %d states compared)", rec.peer_id[:8], snap.version,
             snap.nbytes, snap.seconds, len(states))


class CatchUp:
    """Downloads the freshest members' states on a thread of its own, so that an island that found
    itself far behind the swarm keeps training while it fetches (a slow member's state can take
    minutes); the island adopts the result between two inner steps (`take`)."""

    def __init__(self, island: Any) -> None:
        self._states: list | None = None
        self._thread = threading.Thread(target=self._run, args=(island,), name="catch-up", daemon=True)
        self._thread.start()

    def _run(self, island: Any) -> None:
        try:
            states = download_freshest(island, _freshest(island), CATCH_UP_S)
        except Exception:  # noqa: BLE001 - a failed catch-up leaves the island as it was
            log.exception("catching up failed")
            states = []
        self._states = states

    def take(self) -> list | None:
        """The downloaded states once the thread is done (then once only), else None."""
        if self._thread.is_alive():
            return None
        states, self._states = self._states, None
        return states


def _most_central(states: list, initial: torch.Tensor) -> tuple:
    """The downloaded state with the smallest median distance to the others (ties: closest to `initial`).

    Distances are measured in units of the initial weights' size, the same for every candidate (a
    poisoned state's own size must not make it look close)."""
    if len(states) == 1:
        return states[0]
    unit = max(norm(initial), 1e-12)
    n = len(states)
    far = [[0.0] * n for _ in range(n)]
    for i in range(n):  # symmetric: each pair once
        for j in range(i + 1, n):
            far[i][j] = far[j][i] = distance(states[i][1].phi, states[j][1].phi) / unit

    def score(i: int) -> tuple[float, float]:
        spread = statistics.median(far[i][j] for j in range(n) if j != i)
        return spread, distance(initial, states[i][1].phi) / unit

    best = min(range(len(states)), key=score)
    for j, (rec, _, _) in enumerate(states):
        if j != best and far[best][j] > START_BOUND:
            log.warning("joining: the state of %s is far from the other members'; not adopting it", rec.peer_id[:8])
    return states[best]
