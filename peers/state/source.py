"""Where an island's state comes from when it starts: its last checkpoint, or the freshest member.

A joiner never starts from the initial weights in a running swarm: it downloads the states of
the freshest members (up to three) and adopts the one that agrees best with the others. `--resume` continues from the
last checkpoint in the run folder instead, with everything the island had: outer state, inner
optimizer, scheduler, model buffers and the caller's own state (`peers.state.saving`).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from p2p_diloco.admission import GateSettings
from p2p_diloco.config import NetworkConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.discovery.membership import Membership
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import TransportError
from p2p_diloco.exchange.client import Fetcher
from p2p_diloco.peers.gossip.worker import partner_state, route
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.gossip.measure import distance, norm

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


@dataclass(frozen=True)
class Downloaded:
    """A member's state downloaded whole, checked against this model and run."""

    record: IslandRecord
    state: PartnerState
    wire_bytes: int
    seconds: float


class StateSource:
    """Where a joining, resumed or stale island gets the swarm's state: the freshest members.

    It reads the member list and downloads; it changes the island's outer state only in `adopt`,
    which the island calls on its main thread (a catch-up downloads on a thread of its own)."""

    def __init__(self, identity: Identity, outer: OuterLoop, membership: Membership, network: NetworkConfig,
                 secret: str | None, stopped: Callable[[], bool], relay: str | None = None) -> None:
        """`relay`: the bootstrap's relay endpoint, where the states of members nobody can dial wait."""
        self.identity, self.outer, self.membership, self.stopped = identity, outer, membership, stopped
        self.network, self.secret, self.relay = network, secret, relay

    def wait_for(self, count: int, timeout: float, *, training: bool = False) -> bool:
        """Wait until discovery shows `count` islands, this one included (at most `timeout` s, or
        until the island is stopped); True if it did. `training`: count only the others that train
        (or sync), not those still joining."""
        deadline = time.monotonic() + timeout
        me = self.identity.peer_id
        while sum(p == me or not training or r.state in ("training", "syncing")
                  for p, r in self.membership.members().items()) < count:
            if self.stopped() or time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def freshest(self, ahead: str | None = None) -> list[IslandRecord]:
        """The members ahead of this island (same model), freshest first; `ahead`: a member whose state
        was ahead, counted so whatever its record says (a record is republished less often than a
        state: a catch-up found none ahead by the records and downloaded nothing)."""
        me, v = self.identity, self.outer.state.version
        return sorted((r for p, r in self.membership.members().items()
                       if p != me.peer_id and r.state in ("training", "syncing") and (r.version > v or p == ahead)
                       and (not r.model or r.model == me.model)),
                      key=lambda r: (r.version, r.tokens), reverse=True)

    def download(self, others: list[IslandRecord], within_s: float) -> list[Downloaded]:
        """Download up to `JOIN_QUORUM` of the states of `others` (in order), checked against this model
        and run, within `within_s`. Touches no island state: a catching-up island runs it on a thread."""
        deadline = time.monotonic() + within_s
        states: list[Downloaded] = []
        for rec in others:
            if len(states) >= JOIN_QUORUM or time.monotonic() >= deadline or self.stopped():
                break
            endpoint, via = route(rec, self.relay)
            if endpoint is None:
                log.info("cannot download the state of %s: it is outbound-only and no relay serves it", rec.label)
                continue
            try:
                with Fetcher(endpoint, self.network, via, secret=self.secret) as fetcher:
                    snap = fetcher.fetch(min(self.network.fetch_timeout_s, deadline - time.monotonic()), decode=False)
                state = partner_state(snap, self.outer.state.phi.numel(), self.identity.model, self.identity.run)
                states.append(Downloaded(rec, state, snap.wire_bytes, snap.seconds))
            except TransportError as e:
                log.info("could not download the state of %s: %s; trying another member", rec.label, e)
        return states

    def adopt(self, states: list[Downloaded], started: bool) -> int:
        """Adopt the downloaded state that agrees best with the others (`_most_central`); returns the
        bytes the downloads moved. `started`: the island trained before (it keeps its own state when
        nothing could be downloaded)."""
        if not states:
            log.warning("no member's state could be downloaded; %s", "keeping this island's own" if started
                        else "starting from the initial weights")
            return 0
        best = _most_central(states, self.outer.state.phi)
        self.outer.adopt(best.state, joined=not started)
        log.info("joined from %s at version %d (%d bytes in %.1f s; %d states compared)", best.record.label,
                 best.state.version, best.wire_bytes, best.seconds, len(states))
        return sum(d.wire_bytes for d in states)


class CatchUp:
    """Downloads the freshest members' states on a thread of its own, so that an island that found
    itself far behind the swarm keeps training while it fetches (a slow member's state can take
    minutes); the island adopts the result between two inner steps (`take`)."""

    def __init__(self, source: StateSource, ahead: str | None = None) -> None:
        """`ahead`: the member whose state showed this island behind (`StateSource.freshest`)."""
        self._states: list[Downloaded] | None = None
        self._thread = threading.Thread(target=self._run, args=(source, ahead), name="catch-up", daemon=True)
        self._thread.start()

    def _run(self, source: StateSource, ahead: str | None) -> None:
        try:
            states = source.download(source.freshest(ahead), CATCH_UP_S)
        except Exception:  # noqa: BLE001 - a failed catch-up leaves the island as it was
            log.exception("catching up failed")
            states = []
        self._states = states

    def take(self) -> list[Downloaded] | None:
        """The downloaded states once the thread is done (then once only), else None."""
        if self._thread.is_alive():
            return None
        states, self._states = self._states, None
        return states


class CatchingUp:
    """An island's catch-up, from the state that showed it behind to the state it adopts (see `CatchUp`).

    Far behind the swarm (resumed after a long absence, or stalled), a state that far ahead is
    legitimately far from this island's anchor, but a claimed version proves nothing (the state is
    still refused, and counted); so the island rejoins as a newcomer does, adopting the state most
    of the freshest members agree on, then calls `adopted()` (what was learned of the old state starts over)."""

    def __init__(self, name: str, source: StateSource, adopted: Callable[[], None]) -> None:
        self.name, self.source, self.adopted = name, source, adopted
        self.running: CatchUp | None = None
        """The download of the freshest states, while this island catches up."""

    def start(self, peer: str, version: int, label: str = "") -> None:
        """`peer`'s state at `version` showed this island behind: catch up, unless it already does."""
        if self.running is None:
            log.warning("%s is at version %d, %s at %d: catching up from the freshest members", self.name,
                        self.source.outer.state.version, label or peer[:8], version)
            self.running = CatchUp(self.source, ahead=peer)

    def adopt(self) -> int | None:
        """Between inner steps: adopt what a finished catch-up downloaded. Returns the bytes it
        downloaded, or None while nothing was adopted."""
        states = None if self.running is None else self.running.take()
        if states is None:
            return None
        self.running = None
        if not states:
            log.warning("%s could not catch up: no member's state could be downloaded; it keeps its own", self.name)
            return None
        nbytes = self.source.adopt(states, started=True)
        self.adopted()
        return nbytes


def _most_central(states: list[Downloaded], initial: torch.Tensor) -> Downloaded:
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
            far[i][j] = far[j][i] = distance(states[i].state.phi, states[j].state.phi) / unit

    def score(i: int) -> tuple[float, float]:
        spread = statistics.median(far[i][j] for j in range(n) if j != i)
        return spread, distance(initial, states[i].state.phi) / unit

    best = min(range(len(states)), key=score)
    for j, d in enumerate(states):
        if j != best and far[best][j] > GateSettings().bound:
            log.warning("joining: the state of %s is far from the other members'; not adopting it", d.record.label)
    return states[best]
