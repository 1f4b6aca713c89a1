"""Partner choice: prefer fresh, fast, reachable members, and spread the load.

Each round an island fetches one partner's snapshot. First choice is this version's permutation
partner (`core.schedule.shifted_partner`, what the simulator's islands fetch): islands at the same
version then fetch from distinct partners, so no upload serves two fetches while another serves
none (drawn at random, the four islands of a swarm at 0.5 Mbit/s put two fetches on each of two
uploads and mixed half as often: BENCHMARKS.md, "Slow links"). It is taken when it is a candidate
and not measured more than `SLOW_PARTNER` times slower than the median candidate; otherwise a
weighted random draw (not a fixed best) keeps information flowing through the whole swarm and
keeps everyone from fetching the same island. A candidate's weight multiplies:

- freshness: `1 / (1 + lag)` where lag is how many versions it is behind the freshest member;
  members beyond `max_staleness` behind us are not candidates at all, nor members that have not
  trained yet (their state is the shared initial one, which token weighting would skip anyway);
- speed: the download rate we measured from it before (relative to the median), unmeasured
  members counting as median;
- load: `1 / (1 + upload share)`, the share of the swarm's upload it already carries;
- reachability: after a failed exchange a member is skipped for a backoff that doubles with each
  consecutive failure (2 s .. 60 s); a member whose states were refused before mixing (implausible,
  non-finite) `REFUSALS_TO_DROP` times in a row is set aside, for longer each time (`SET_ASIDE_S`);
- variety: the partner of the previous round counts half;
- standing: the share of its weight a partner's record leaves it (`share`; `peers.admission.trust`),
  and a permutation partner whose record holds it is passed over for the draw;
- model: a member whose record shows another model fingerprint is never a candidate;
- who can dial whom: a member that runs outbound-only (`reach="outbound"`, behind a NAT) cannot be
  dialled, so it is a candidate only through the bootstrap's relay (`relay=True`); without one it
  still reaches this island by pushing its state when it fetches from us (`peers.gossip.reach`).

With `ring=True` (islands that exchange public-state updates, `core.public`) the draw gives way to
a fixed order: the candidate that follows this island in the ring of peer ids, the same one round
after round while it stays a candidate, so the island lacks one update of it per round instead of
all those since it last met a random partner. Each island then serves one fetch per round.

The caller may also ask only for members that have reached a version (`min_version`) and, in the
draw, that were not among its last two partners (`skip_recent=True`, while other live members
remain): the runner does both early in each round, see `IslandConfig.same_version_wait`, where the
fetch waits for the partner to publish the island's version (`waits=True`: a permutation partner
that has not trained yet qualifies). Without the second, the
island that runs ahead fetched whichever member published first, the same one round after round,
and pairs of islands locked onto each other (BENCHMARKS.md, Swarm).
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from p2p_diloco.core.schedule import ring_successor, shifted_partner, worth_fetching
from p2p_diloco.discovery.records import IslandRecord

log = logging.getLogger(__name__)

MIN_BACKOFF_S, MAX_BACKOFF_S = 2.0, 60.0
"""Backoff after a failed exchange: the first, doubling with each failure in a row, up to the last."""
RECENT_PARTNERS = 2
"""Partners remembered for `skip_recent` (early in a round the last two are skipped)."""
MAX_SPEED_FACTOR = 4.0
"""A member measured this many times faster than the median weighs at most this many times more."""
LAST_PARTNER_FACTOR = 0.5
"""The partner of the previous round weighs this much (variety), unless it is the only candidate."""
RATE_SMOOTHING = 0.5
"""Weight of a new measured download rate against the remembered one (exponential average)."""
SLOW_PARTNER = 2.0
"""The permutation partner is skipped for a weighted draw when measured this many times slower
than the median candidate (a home link among datacentre ones: the draw's speed weight decides)."""
REFUSALS_TO_DROP = 3
"""A member whose states were refused this many times in a row is set aside (`SET_ASIDE_S`)."""
SET_ASIDE_S = 30.0
"""How long a member is first set aside after `REFUSALS_TO_DROP` refusals; each later time, 4x longer.
Not for ever: an attack can push two honest islands apart until each refuses the other, and they
must be able to mix again once it is over."""


@dataclass
class _PeerHistory:
    rate_bps: float | None = None
    refusals: int = 0
    """Refusals since the last state of it that was mixed (or since it was last set aside)."""
    set_aside: int = 0
    """Times it was set aside for its refusals."""
    failures: int = 0
    retry_after: float = 0.0


@dataclass
class PartnerChooser:
    self_id: str
    max_staleness: int = 8
    model: str = ""
    """This island's model fingerprint: members showing another one are skipped ("" matches all)."""
    relay: bool = False
    """The bootstrap relays states, so outbound-only members can be fetched through it."""
    ring: bool = False
    """Choose the next candidate in the ring of peer ids instead of drawing one (see the module docstring)."""
    rng: random.Random = field(default_factory=random.Random)
    clock: callable = time.monotonic
    history: dict[str, _PeerHistory] = field(default_factory=dict)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_PARTNERS))
    """The last partners picked, newest last."""
    excluded: set = field(default_factory=set)
    """Members never chosen again (their state did not fit this island's model)."""
    share: Callable[[str, Mapping[str, IslandRecord]], float] = lambda peer, members: 1.0
    """The share of its weight a member's record leaves it, in (0, 1], read with the members' records the
    choice reads (`peers.admission.trust.share`)."""

    @property
    def last(self) -> str | None:
        return self.recent[-1] if self.recent else None

    def candidates(self, members: dict[str, IslandRecord], own_version: int, min_version: int = 0,
                   skip_recent: bool = False, waits: bool = False) -> dict[str, float]:
        """Weights of the members we could fetch from now (empty when there are none). `waits`: the
        fetch waits for the partner to publish `own_version` (>= 1), so one that has not trained yet
        qualifies too (it will have when it answers)."""
        now = self.clock()
        avoid: set[str] = set()
        if skip_recent:  # skip recent partners, as many as leaves at least one other live member
            live = {pid for pid, r in members.items() if pid != self.self_id and r.state == "training"}
            for pid in reversed(self.recent):
                if pid in live and len(live - avoid) > 1:
                    avoid.add(pid)
        others = {pid: r for pid, r in members.items()
                  if pid != self.self_id and pid not in avoid and pid not in self.excluded
                  and r.state in ("training", "syncing") and (worth_fetching(r.tokens) or (waits and own_version >= 1))
                  and r.version >= min_version and self._same_model(pid, r)
                  and (r.reach == "direct" or self.relay)
                  and own_version - r.version <= self.max_staleness
                  and self.history.get(pid, _PeerHistory()).retry_after <= now}
        if not others:
            return {}
        freshest = max(r.version for r in others.values())
        median_rate = self.measured_rate(among=others) or 1.0
        total_upload = sum(r.upload_bps for r in others.values()) or 1.0
        weights = {}
        for pid, r in others.items():
            w = 1.0 / (1 + freshest - r.version)
            rate = self.history.get(pid, _PeerHistory()).rate_bps
            w *= min(MAX_SPEED_FACTOR, (rate or median_rate) / median_rate)
            w /= 1 + r.upload_bps / total_upload
            if pid == self.last and len(others) > 1:
                w *= LAST_PARTNER_FACTOR
            weights[pid] = w * self.share(pid, members)
        return weights

    def _same_model(self, pid: str, record: IslandRecord) -> bool:
        """False for a member whose record shows another model (logged once per member)."""
        if not self.model or not record.model or record.model == self.model:
            return True
        if self.exclude(pid):
            log.warning("member %s runs another model (fingerprint %s, ours %s); never mixing with it",
                        record.label, record.model, self.model)
        return False

    def choose(self, members: dict[str, IslandRecord], own_version: int, min_version: int = 0,
               skip_recent: bool = False, waits: bool = False, ring: bool | None = None) -> IslandRecord | None:
        """A partner (see the module docstring), or None when there is no candidate. `skip_recent`
        spares the last two partners from the weighted draw, not from the permutation; with `waits`
        the permutation partner may not have trained yet (the fetch waits until it has); `ring`
        overrides the chooser's own for this choice (`--exchange auto`, a fetch of updates)."""
        if self.ring if ring is None else ring:  # the successor, whatever version it is at now (the fetch may wait)
            pick = ring_successor(self.candidates(members, own_version), self.self_id)
            if pick is None:
                return None
            self.recent.append(pick)
            return members[pick]
        weights = self.candidates(members, own_version, min_version, skip_recent)
        pick = self._shifted(members, own_version, self.candidates(members, own_version, min_version, waits=waits))
        if not weights and pick is None:
            return None
        if pick is None:
            ids = sorted(weights)
            pick = self.rng.choices(ids, weights=[weights[i] for i in ids])[0]
        self.recent.append(pick)
        return members[pick]

    def _shifted(self, members: dict[str, IslandRecord], own_version: int, weights: dict[str, float]) -> str | None:
        """This version's permutation partner among the live members of this model, if it is a
        candidate (`weights`) and not measured much slower than the others (`SLOW_PARTNER`)."""
        live = [pid for pid, r in members.items()
                if r.state in ("training", "syncing") and not (self.model and r.model and r.model != self.model)]
        pick = shifted_partner(live, self.self_id, own_version)
        if pick not in weights or self.share(pick, members) < 1:
            return None
        rate, median = self.history.get(pick, _PeerHistory()).rate_bps, self.measured_rate(among=weights)
        return None if rate and median and rate * SLOW_PARTNER < median else pick

    def succeeded(self, peer_id: str, nbytes: int, seconds: float) -> None:
        h = self.history.setdefault(peer_id, _PeerHistory())
        rate = nbytes / max(seconds, 1e-6)
        h.rate_bps = rate if h.rate_bps is None else (1 - RATE_SMOOTHING) * h.rate_bps + RATE_SMOOTHING * rate
        h.failures, h.retry_after = 0, 0.0

    def measured_rate(self, among: Iterable[str] | None = None) -> float | None:
        """The median download rate measured from partners (those `among`, else all), bytes per
        second (None: none measured yet)."""
        rates = [h.rate_bps for pid, h in self.history.items() if h.rate_bps and (among is None or pid in among)]
        return statistics.median(rates) if rates else None

    def exclude(self, peer_id: str) -> bool:
        """Never choose `peer_id` again; True the first time (so the caller logs it once)."""
        new = peer_id not in self.excluded
        self.excluded.add(peer_id)
        return new

    def refused(self, peer_id: str) -> float | None:
        """A state of `peer_id` was refused before mixing: back off as after a failure, and at the
        `REFUSALS_TO_DROP`th refusal in a row set the member aside; returns for how many seconds then
        (`SET_ASIDE_S`, 4x longer each time), else None."""
        h = self.history.setdefault(peer_id, _PeerHistory())
        h.refusals += 1
        self.failed(peer_id)
        if h.refusals < REFUSALS_TO_DROP:
            return None
        seconds = SET_ASIDE_S * 4 ** h.set_aside
        h.refusals, h.set_aside, h.retry_after = 0, h.set_aside + 1, self.clock() + seconds
        return seconds

    def mixed(self, peer_id: str) -> None:
        """A state of `peer_id` passed every check: its refusals in a row start over."""
        self.history.setdefault(peer_id, _PeerHistory()).refusals = 0

    def shunned(self, peer_id: str) -> bool:
        """Whether a state of `peer_id` is not taken now (excluded, or set aside for its refusals)."""
        h = self.history.get(peer_id)
        return peer_id in self.excluded or (h is not None and h.set_aside > 0 and h.retry_after > self.clock())

    def failed(self, peer_id: str) -> None:
        h = self.history.setdefault(peer_id, _PeerHistory())
        h.failures += 1
        h.retry_after = self.clock() + min(MAX_BACKOFF_S, MIN_BACKOFF_S * 2 ** (h.failures - 1))
