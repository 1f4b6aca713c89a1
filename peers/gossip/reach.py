"""Who can dial whom: the reachability check at start, and the states pushed by islands nobody can dial.

An island behind a NAT or a firewall can open connections but not accept them. At start it asks
the bootstrap node to dial its snapshot server back (`discovery.reachability`); when that fails it
says so in one line that tells its owner what to fix, and runs **outbound-only**: its record says
`reach="outbound"`, its DHT node runs in client mode, and each time it fetches from a reachable
partner it pushes its own state over the same connection (`exchange.push`), so its training still
reaches the swarm. Two outbound-only islands learn from each other through the reachable ones they
both mix with, or through the bootstrap's relay when it runs one (`bootstrap --relay`).

`PushInbox` is the receiving side inside a reachable island: it admits a push only from a member
that is outbound-only, of this model and run, and only while it has room (one pushed state per
round, so a crowd of NATed islands cannot flood a reachable one; the member it took last waits
while another one it turned away is waiting, so a faster pusher cannot starve the others), measures the arrived state's
distance on a thread of its own, and hands it to the round as a fetched state is handed over: the
same checks, the same weights.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from p2p_diloco.config import DiscoveryConfig, IslandConfig
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.peers.gossip.worker import FetchResult
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.gossip.measure import Measured

log = logging.getLogger(__name__)
TURN_WAIT_S = 5.0
"""A member turned away as busy keeps its turn this long (it pushes again each of its rounds)."""
DIALBACK_TIMEOUT_S = 5.0
"""How long the check waits for the bootstrap node's answer (its own dial gives up after 3 s)."""


@dataclass(frozen=True)
class Reach:
    mode: str
    """`direct` (others can dial this island) or `outbound` (it only opens connections)."""
    relay: str | None = None
    """The bootstrap's relay endpoint, when it runs one."""


def check_reach(island_cfg: IslandConfig, discovery: DiscoveryConfig, endpoint: str) -> Reach:
    """Decide this island's mode: ask the bootstrap node to dial `endpoint` back (which also says
    whether it relays), and go by its answer with `IslandConfig.reach="auto"`, else by the setting.
    Logs the one line a person needs when others cannot reach the island."""
    from p2p_diloco.discovery.reachability import check_reachable, unreachable_message

    if not discovery.bootstrap:  # the first island of a swarm: nobody to ask, nobody to push to
        return Reach(mode="outbound" if island_cfg.reach == "outbound" else "direct")
    answer = check_reachable(discovery.bootstrap, endpoint, discovery.run_id, DIALBACK_TIMEOUT_S)
    if island_cfg.reach != "auto":
        return Reach(mode=island_cfg.reach, relay=answer.relay)
    if answer.reachable is None:
        log.info("could not check whether %s is reachable from outside (%s); assuming it is", endpoint, answer.reason)
        return Reach(mode="direct", relay=answer.relay)
    if answer.reachable:
        log.info("reachable from outside at %s", endpoint)
        return Reach(mode="direct", relay=answer.relay)
    log.warning("%s", unreachable_message(endpoint, answer, island_cfg.port, discovery.port or None))
    return Reach(mode="outbound", relay=answer.relay)


@dataclass(frozen=True)
class Door:
    """What `PushInbox` asks of its island, once the island has started."""

    identity: Identity
    members: Callable[[], dict[str, IslandRecord]]
    """The member list as discovery shows it."""
    excluded: Callable[[str], bool]
    """Whether the island takes no state of that member now (`PartnerChooser.shunned`)."""
    measure: Callable[[object], Measured | None]
    """What a state measured (`GossipWorker.measured`, `peers.gossip.measure.measure`), on the inbox's own thread."""


class PushInbox:
    """Pushed states arriving at a reachable island, on their way to being mixed (see the module
    docstring); the island server's `exchange.push.PushPolicy`. It turns pushes away as busy until
    the island has started and opened its `Door`."""

    def __init__(self) -> None:
        self.door: Door | None = None
        self._lock = threading.Lock()
        self._result: FetchResult | None = None
        self._arriving = False
        self._taken_this_round = False
        self._last_taken: str | None = None
        self._waiting: dict[str, float] = {}
        """Members turned away as busy since their last push was taken, and when (their turn comes first)."""

    @property
    def has_result(self) -> bool:
        with self._lock:
            return self._result is not None

    def new_round(self) -> None:
        """One pushed state may be taken per round."""
        with self._lock:
            self._taken_this_round = False

    def admit(self, manifest) -> tuple[str, str] | None:
        """Before a push's bytes flow (on the server's thread): None to take it, else (code, reason)."""
        door, meta = self.door, manifest.meta
        if door is None:
            return "busy", "this island is still starting"
        peer = meta.get("peer_id")
        member = door.members().get(peer) if isinstance(peer, str) else None
        if member is None or member.reach != "outbound":
            return "refused", "pushes are taken only from members that run outbound-only"
        if door.excluded(peer):
            return "refused", "this island no longer mixes that member's states (refused too often)"
        if (foreign := door.identity.foreign(meta, strict=True)) is not None:
            return "refused", f"a state of {foreign[1]}"
        with self._lock:
            if self._result is not None or self._arriving or self._taken_this_round:
                self._waiting[peer] = time.monotonic()
                return "busy", "this island already took a pushed state this round; push to another partner"
            if peer == self._last_taken and self._another_waits(peer):
                return "busy", "this island took this member's state last; another member's turn"
            self._arriving = True
            self._waiting.pop(peer, None)
        return None

    def _another_waits(self, peer: str) -> bool:
        """Whether a member other than `peer` was turned away in the last `TURN_WAIT_S` (lock held)."""
        now = time.monotonic()
        self._waiting = {w: t for w, t in self._waiting.items() if now - t < TURN_WAIT_S}
        return any(w != peer for w in self._waiting)

    def dropped(self, manifest) -> None:
        """An admitted push failed on its way: room for another."""
        with self._lock:
            self._arriving = False

    def stored(self, pushed) -> None:
        """A whole, checked push arrived (server thread): measure it on a thread of its own."""
        threading.Thread(target=self._measure, args=(pushed,), name="push-measure", daemon=True).start()

    def _measure(self, pushed) -> None:
        from p2p_diloco.exchange.client import Snapshot

        m = pushed.manifest
        snap = Snapshot(tensors=pushed.tensors, version=m.version, tokens=m.tokens, meta=dict(m.meta), nbytes=m.total,
                        wire_bytes=m.total, seconds=pushed.seconds, endpoint=f"a push from {pushed.address}",
                        stats=None, manifest=m)
        measured = self.door.measure(snap)
        result = FetchResult(str(m.meta.get("peer_id")), snap, None, pushed.seconds, m.total, measured=measured,
                             pushed=True)
        with self._lock:
            self._result, self._arriving = result, False

    def take(self) -> FetchResult | None:
        with self._lock:
            result, self._result = self._result, None
            if result is not None:
                self._taken_this_round, self._last_taken = True, result.peer_id
            return result
