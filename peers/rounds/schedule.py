"""An island's rounds between two inner steps: keep a fetch going, mix what arrived, end the round.

`Rounds` is the part of `SwarmIsland` that owns the round's schedule: when to look for a partner,
when to mix what arrived (fetched or pushed: `peers.rounds.mixing`), when a round is over, the
mixes of its end, and the final mix. The island (`peers.island`) holds its life: start, `step()`,
the outer step's bookkeeping (publish, announce, metrics, checkpoints), close. All of it runs inside
`SwarmIsland.step()`, between two of the user's inner steps, and never waits on the network.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from p2p_diloco.config import DiLoCoConfig, IslandConfig, NetworkConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.schedule import FINAL_MIX_WAIT_S
from p2p_diloco.discovery.membership import Membership
from p2p_diloco.discovery.records import label_among
from p2p_diloco.peers.rounds.alone import AloneWatch, Link
from p2p_diloco.peers.admission.admission import Admission
from p2p_diloco.peers.admission.protocol import Admitted
from p2p_diloco.peers.gossip.fetchchoice import FetchChoice
from p2p_diloco.peers.gossip.worker import GossipWorker
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.rounds.pacing import catch_up_seconds
from p2p_diloco.peers.gossip.partners import PartnerChooser
from p2p_diloco.peers.gossip.publishing import Publisher
from p2p_diloco.peers.gossip.reach import PushInbox
from p2p_diloco.peers.rounds.mixing import Mixing
from p2p_diloco.peers.rounds.tally import Round, Tally
from p2p_diloco.peers.state.source import CatchingUp

log = logging.getLogger(__name__)
ANNOUNCE_EVERY_S = 2.0
"""Mid-round, the island's record is announced again this often (the dashboard's tokens/s and loss)."""
FRESH_RECORD_S = 3 * ANNOUNCE_EVERY_S
"""Pacing counts only records younger than this: a dead island's record lingers until it expires."""
RETRY_PARTNER_S = 0.5
"""How often a round that found no partner at its start looks again (one may have published since)."""
LINGER_GRACE_S = 1.0
"""After the final mix an island serves on this long after the last member behind it caught up."""
RETRY_FINAL_S = 0.1
"""How often the final mix looks for such a partner, and a lingering island for members behind."""


class Rounds:
    """The round's schedule of one island (see the module docstring)."""

    def __init__(self, *, identity: Identity, outer: OuterLoop, diloco: DiLoCoConfig, island: IslandConfig,
                 network: NetworkConfig, membership: Membership, gossip: GossipWorker, chooser: PartnerChooser,
                 admission: Admission, catching_up: CatchingUp, inbox: PushInbox, publisher: Publisher, tally: Tally,
                 alone: AloneWatch, stopped: Callable[[], bool]) -> None:
        self.identity, self.outer, self.diloco, self.cfg, self.network = identity, outer, diloco, island, network
        self.membership, self.gossip, self.chooser, self.catching_up = membership, gossip, chooser, catching_up
        self.inbox, self.publisher, self.tally, self.alone, self.stopped = inbox, publisher, tally, alone, stopped
        self.rnd = Round.begin(island.same_version_wait, 0.0)
        self.choice = FetchChoice(publisher.exchange, identity.name, identity.peer_id, publisher.public_side.at_start)
        """What each fetch asks for (`--exchange auto`: whole states or updates, from the link)."""
        self.mixing = Mixing(outer=outer, diloco=diloco, membership=membership, gossip=gossip, inbox=inbox,
                             admission=admission, choice=self.choice, tally=tally, alone=alone, label=self.label)
        self.last_round_s = 0.0
        """How long the previous round took, start to end."""
        self.training_from: float | None = None
        """Monotonic time of the first round's start: `max_seconds` counts from there."""

    def begin(self, last_compute_s: float, training_from: float | None = None) -> Round:
        """A new round, now (`last_compute_s`: the inner-step time of the previous one; `training_from`:
        given for the first round, when the time budget starts)."""
        self.rnd = Round.begin(self.cfg.same_version_wait, last_compute_s)
        self.training_from = self.training_from if training_from is None else training_from
        return self.rnd

    def time_spent(self) -> bool:
        """`max_seconds` of training have passed."""
        limit, since = self.cfg.max_seconds, self.training_from
        return limit is not None and since is not None and time.monotonic() - since >= limit

    def budget_spent(self, rounds: int, own_tokens: int) -> bool:
        """The island's budget (rounds, tokens, seconds) is spent, or it was asked to stop."""
        c = self.cfg
        return bool(self.stopped() or self.time_spent()
                    or (c.max_rounds is not None and rounds >= c.max_rounds)
                    or (c.max_tokens is not None and own_tokens >= c.max_tokens))

    def tokens_per_s(self) -> float:
        return self.rnd.tokens / max(self.rnd.compute_s, 1e-6)

    def over(self, own_tokens: int) -> bool:
        """H steps (stretched while most others are behind), the time or token budget, or a stop: the
        budget ends the round at the first step past it, not at the round's end."""
        rnd, steps, H = self.rnd, self.outer.round_steps, self.diloco.local_steps
        if self.stopped() or self.time_spent() or steps >= H + int(self.cfg.max_stretch * H):
            return True
        if self.cfg.max_tokens is not None and own_tokens + rnd.tokens >= self.cfg.max_tokens:
            return True
        if self.diloco.round_seconds and time.monotonic() - rnd.start >= self.diloco.round_seconds:
            return True
        return steps >= H and self._stretch_over()

    def _stretch_over(self) -> bool:
        """Past H: train on while most of the others are behind in their rounds (`max_stretch`)."""
        rnd = self.rnd
        if rnd.stretch_until is None:
            rnd.stretch_until = time.monotonic() + catch_up_seconds(
                self.membership.members(), self.identity.peer_id, self.publisher.published_at, time.time(),
                fresh_s=FRESH_RECORD_S)
        return time.monotonic() >= rnd.stretch_until

    def between_steps(self) -> None:
        """Keep a fetch going (one that does not fit the link gives way), mix what arrived (fetched or
        pushed), adopt a finished catch-up."""
        self._give_way()
        self._keep_fetching()
        self.rnd.arrived = self.rnd.arrived or self.mixing.arrived(self.rnd)
        self.mixing.pushed(self.rnd)
        nbytes = self.catching_up.adopt()
        if nbytes is not None:
            self.tally.bytes_in += nbytes
            self.mixing.changed = True
            self.alone.mixed()  # it took the swarm's state: not alone

    def _keep_fetching(self) -> None:
        """Start a fetch when none runs and it is time to look for a partner (again)."""
        rnd, now = self.rnd, time.monotonic()
        if rnd.fetching or now < rnd.next_try or self.catching_up.running is not None:
            return  # (catching up, every partner's state would be refused as too far: wait for it)
        same_version = now < rnd.fresh_until
        rnd.fetching = self._start_fetch(rnd.fresh_until if same_version else None)
        # look again soon, and at once when the wait for a partner at our version ends
        rnd.next_try = min(now + RETRY_PARTNER_S, rnd.fresh_until) if same_version else now + RETRY_PARTNER_S

    def _start_fetch(self, fresh_until: float | None = None) -> bool:
        """Start fetching a partner's snapshot unless one is on its way or waits to be taken; True if so.

        Until `fresh_until` (monotonic), only a partner at this island's version, or one version
        behind and so about to publish it, that was not one of the last two partners qualifies;
        the fetch then waits for it to publish this version, until `fresh_until`. A fetch that need
        not wait (`FetchChoice.waits`) takes any partner, and waits too where it finds none."""
        if self.gossip.busy or self.gossip.has_result:
            return True
        v, members = self.outer.state.version, self.membership.members()
        updates, ring = self.choice.next(self.publisher.state_bytes, self.last_round_s)
        rate, partner, started = self.choice.slowest_rate(), None, False
        if fresh_until is None or not self.choice.waits(updates):
            partner = self.chooser.choose(members, v, ring=ring)
            started = partner is not None and self.gossip.start(partner, updates=updates, rate_bps=rate)
        if partner is None and fresh_until is not None:
            partner = self.chooser.choose(members, v, min_version=v - 1, skip_recent=True, waits=True, ring=ring)
            started = partner is not None and self.gossip.start(partner, min_version=v, wait_until=fresh_until,
                                                                updates=updates, rate_bps=rate)
        if started:
            self.choice.started(partner.peer_id, updates)
            self.alone.exchanged()
        return started

    def _give_way(self) -> None:
        """A whole-state fetch that will not fit the link is given up for updates (`--exchange auto`)."""
        if self.choice.judging and self.choice.give_way(self.gossip.progress(), self.publisher.state_bytes,
                                                        self.last_round_s):
            self.gossip.cancel()

    def final_mix(self) -> dict | None:
        """`final_mix`, the budget spent: fetch one partner's last state and mix it into the anchor and
        the model before the final checkpoint, then serve on while a member still training is
        behind it and may want ours (`_linger`).

        For `FINAL_MIX_WAIT_S` (or the round's own wait, if longer) only a partner at this island's
        version or one behind is fetched, and the fetch waits for it to publish this version, as a
        round's start does (discovery may show a partner's last versions a second late); then any
        partner. A lone island skips it. At most `FINAL_MIX_WAIT_S` plus the fetch timeout, and as much
        again to serve a partner's fetch. Returns the exchange's figures, or None when nothing was mixed."""
        rnd = self.rnd
        deadline = max(rnd.fresh_until, time.monotonic() + FINAL_MIX_WAIT_S)
        while not (rnd.fetching or self.stopped() or time.monotonic() >= deadline or self._alone()):
            rnd.fetching = self._start_fetch(deadline)
            if not rnd.fetching:
                time.sleep(RETRY_FINAL_S)
        if not (rnd.fetching or self.stopped() or self._alone()):
            rnd.fetching = self._start_fetch()
        end = deadline + self.network.fetch_timeout_s
        while rnd.fetching and not self.stopped() and time.monotonic() < end:
            if self.gossip.wait_result(RETRY_FINAL_S):  # (in slices: a stop is not held up by a slow fetch)
                break
        info = self.mixing.arrived(rnd)
        if info is not None:
            log.info("%s: final mix with %s at weight %.3f", self.identity.name, self.label(info["partner"]), info["weight"])
        self._linger(deadline)
        return info

    def label(self, peer_id: str | None) -> str:
        """How a partner is shown: its name in its record, or its peer id's prefix."""
        return label_among(self.membership.members(), peer_id)

    def _others_training(self) -> list:
        return [r for pid, r in self.membership.members().items() if pid != self.identity.peer_id and r.state == "training"]

    def _alone(self) -> bool:
        return not self._others_training()

    def _linger(self, until: float) -> None:
        """Serve this island's last state while a member still training is behind it (until `until`
        at most) or a partner's fetch from it is under way (a fetch timeout longer at most), and
        `LINGER_GRACE_S` after both ended: that member may want this state for its own final mix,
        and discovery shows its catching up a second late."""
        self.publisher.published_last()
        v, seen, end = self.outer.state.version, None, until + self.network.fetch_timeout_s
        while not self.stopped() and (now := time.monotonic()) < end:
            if (now < until and any(r.version < v for r in self._others_training())) or self.publisher.serving():
                seen = now
            elif seen is None or now - seen >= LINGER_GRACE_S:
                return
            time.sleep(RETRY_FINAL_S)

    def finish(self) -> tuple[dict, int]:
        """The round is over: mix what arrived after its last step (pushed or fetched) into the
        anchor, take the outer step; returns the exchange's figures for the round's row and its
        inner steps."""
        rnd, outer, steps = self.rnd, self.outer, self.outer.round_steps
        self.mixing.pushed(rnd)  # one pushed to us after the last inner step
        outcome = self.mixing.take()  # a fetch that arrived after the last inner step
        if isinstance(outcome, Admitted):
            info = self.mixing.mix(outcome, rnd, at_end=True)
        else:
            outer.end_round([], tokens=rnd.tokens)
            info = outcome.figures if outcome is not None else {"partner": None, "fetch_s": None, "bytes_in": 0}
            info = rnd.arrived if rnd.arrived is not None else info
        self.mixing.admission.own_round(rnd.tokens)
        self.inbox.new_round()
        self.mixing.changed = True
        if rnd.refused_from:
            info["refused_from"] = rnd.refused_from
        if rnd.gave_way:
            info["gave_way"] = rnd.gave_way
        if rnd.pushed_in:
            info["pushed_in"] = rnd.pushed_in
        self.last_round_s = time.monotonic() - rnd.start
        self.mixing.finished += 1
        running_s, _, _, data_rate = self.gossip.progress() or (0.0, 0, 0.0, math.nan)
        rate = self.chooser.measured_rate() or (data_rate if data_rate > 0 else None)  # (not a manifest's bytes)
        link = Link(rate, self.publisher.state_bytes, time.monotonic() - rnd.start, running_s,
                    updates=self.publisher.exchange.updates)
        others = len(self._others_training())
        if (why := self.alone.end_round(others, link, self.diloco.max_staleness, time.monotonic())) is not None:
            info["alone"] = why
        return info, steps
