"""Mixing what arrived: a partner's state, fetched or pushed, admitted, mixed and counted, in one place.

`Mixing` is the part of an island's rounds (`peers.rounds.schedule`) that takes an exchange that
ended, has the admission judge it (`peers.admission`: one typed outcome), mixes what was admitted
(on arrival into the anchor and the running weights, or at the round's end into the anchor before
the outer step) and counts it: the mix and its bookkeeping are written once (`mix`).
"""

from __future__ import annotations

from collections.abc import Callable

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.discovery.membership import Membership
from p2p_diloco.peers.admission.admission import Admission
from p2p_diloco.peers.admission.claims import median_version
from p2p_diloco.peers.admission.protocol import Admitted, Cancelled, Failed, Outcome, Refused
from p2p_diloco.peers.gossip.fetchchoice import FetchChoice
from p2p_diloco.peers.gossip.reach import PushInbox
from p2p_diloco.peers.gossip.worker import FetchResult, GossipWorker
from p2p_diloco.peers.rounds.alone import AloneWatch
from p2p_diloco.peers.rounds.tally import Round, Tally


class Mixing:
    """Takes, admits, mixes and counts partners' states for one island (see the module docstring)."""

    def __init__(self, *, outer: OuterLoop, diloco: DiLoCoConfig, membership: Membership, gossip: GossipWorker,
                 inbox: PushInbox, admission: Admission, choice: FetchChoice, tally: Tally, alone: AloneWatch,
                 label: Callable[[str | None], str]) -> None:
        self.outer, self.diloco, self.membership, self.gossip, self.inbox = outer, diloco, membership, gossip, inbox
        self.admission, self.choice, self.tally, self.alone, self.label = admission, choice, tally, alone, label
        self.changed = False
        """The weights changed outside an inner step (a mix): torchrun ranks must sync."""
        self.last_mix: tuple[str | None, int] = (None, 0)
        """The partner of the last mix, and the rounds finished then (`suspect`)."""
        self.finished = 0
        """The island's rounds finished (counted by the schedule, `Rounds.finish`)."""

    def take(self, result: FetchResult | None = None) -> Outcome | None:
        """The outcome of the exchange that ended (the fetch's, or the push given), admitted or not
        (`peers.admission`: a pushed state gets every check a fetched one gets); None: none ended."""
        result = result or self.gossip.take()
        if result is None:
            return None
        outcome = self.admission.admit(result)
        self.tally.bytes_in += result.nbytes
        if isinstance(outcome, Refused):
            self.alone.refused(self.label(result.peer_id), outcome.reason, outcome.foreign)
        elif isinstance(outcome, Failed):
            self.tally.failed += 1
            self.alone.fetch_failed(outcome.error)
        if result.snapshot is not None and not result.pushed:
            fetched = outcome.figures["fetched"] = "state" if result.public is None else "updates"
            self.tally.fetched[fetched] += 1
            self.choice.landed(result.peer_id, result.rate_bps, result.nbytes)
        return outcome

    def arrived(self, rnd: Round) -> dict | None:
        """Between inner steps (and for the final mix): mix a partner state the moment its fetch is done.

        The anchor and the running weights move together, so the rest of the round trains from the
        mixed point. Returns the exchange's figures, or None while nothing has arrived (or what
        arrived was refused or given up: the round looks for another partner).
        """
        if not self.gossip.has_result:  # (it may still be pushing ours)
            return None
        outcome = self.take()
        if isinstance(outcome, Refused):  # a refused state costs nothing else: look for another partner this round
            rnd.refused_from.append(outcome.figures["partner"])
            rnd.fetching = False
            return None
        if isinstance(outcome, Cancelled):  # a whole state that gave way: fetch updates now
            rnd.gave_way = outcome.figures["partner"]
            rnd.fetching = False
            return None
        if outcome is None:
            return None
        if isinstance(outcome, Admitted):
            return self.mix(outcome, rnd)
        return {**outcome.figures, "weight": 0.0}

    def pushed(self, rnd: Round) -> None:
        """Mix a state an outbound-only member pushed to us (`peers.gossip.reach`): between inner steps, or
        at the round's end for one that arrived after the last step."""
        if not self.inbox.has_result:
            return
        result = self.inbox.take()
        self.alone.exchanged()
        outcome = self.take(result)
        entry = {"partner": result.peer_id, "weight": 0.0}
        if isinstance(outcome, Refused):
            entry["refused"] = outcome.reason
        if isinstance(outcome, Admitted):
            figures = self.mix(outcome, rnd, pushed=True)
            entry.update((k, figures[k]) for k in ("weight", "staleness"))
        rnd.pushed_in.append(entry)

    def mix(self, admitted: Admitted, rnd: Round, at_end: bool = False, pushed: bool = False) -> dict:
        """Mix an admitted state: on arrival into the anchor and the running weights, or `at_end` into
        the anchor before the outer step (`OuterLoop.end_round`, which takes the step too); then count
        it, tell the admission, and follow a partner far ahead as far as the members' median confirms
        (an island resumed behind catches up at once; one false claim moves it by `max_version_jump`
        at most, `core.outer`). Returns the exchange's figures for the round's row."""
        figures, state, steps = dict(admitted.figures), admitted.state, self.outer.round_steps
        if at_end:  # (the staleness as the outer step left it, a partner ahead counting 0)
            weight = self.outer.end_round([state], tokens=rnd.tokens)[0]
            lag = self.outer.state.version - 1 - state.version
        else:
            lag = self.outer.state.version - state.version
            weight = self.outer.mix_arrived(state)
        figures.update(weight=weight, staleness=lag, mixed_after_steps=steps)
        self.admission.mixed(figures["partner"], weight)
        if weight > 0:
            t = self.tally
            t.mixes += 1
            self.last_mix = (figures["partner"], self.finished)
            if not pushed:
                t.last_partner, t.last_staleness = figures["partner"], lag
            self.changed = True
            self.alone.mixed()
            median = median_version(self.membership.members())
            if median is not None:
                s = self.outer.state
                s.version = max(s.version, min(state.version, median) + int(at_end))
        elif lag > self.diloco.max_staleness:
            self.tally.too_stale += 1
            self.alone.arrived_stale(lag)
        return figures

    def suspect(self) -> str | None:
        """The partner whose state was mixed last, if that was in this round or at the end of the one
        before: a divergence now is blamed on it (`peers.rounds.divergence`)."""
        partner, at = self.last_mix
        return partner if partner is not None and at >= self.finished - 1 else None
