"""One admission for every partner state, fetched or pushed: the checks in order, their verdicts folded.

`Admission.admit` turns an exchange that ended (`peers.gossip.worker.FetchResult`) into one `Outcome`:
`Cancelled` (this island gave it up), `Failed` (the link), `Refused` (a check's reason, or bytes
that did not check out on the way: digests, sizes, finite values, `exchange.payload`) or `Admitted`
with the one weight it is mixed with. The checks (`peers.admission.registry`) run in the order the
config sets (`p2p_diloco.admission.AdmissionConfig.checks`): `identity` first, after which the state
is read (`peers.gossip.worker.partner_state`); the first refusal wins; caps take the smallest, factors
multiply the weight the checks before allowed, the momentum takes the smallest scale; claims are
counted as the last check that counted them says. The base weight is `core.outer.mixing_weight`
(tokens and staleness) of the state as counted.

What a verdict does beyond the state: a refused partner backs off, or is never chosen again
(`never_again`; `peers.gossip.partners`); a state refused for where it sits (`far`) while it is
`STALE_LAG` versions ahead means this island may be the stale one, so it catches up
(`peers.state.source.CatchUp`, on a thread of its own). Per-partner memory is the ledger's
(`peers.admission.ledger`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.outer import PartnerState, mixing_weight
from p2p_diloco.discovery.records import IslandRecord, label_among
from p2p_diloco.errors import TransportError
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import (Admitted, Cancelled, Candidate, Check, Failed, Island, Outcome,
                                                 Refused, Remembers, Verdict)
from p2p_diloco.peers.gossip.worker import FetchResult, partner_state
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.gossip.partners import PartnerChooser
from p2p_diloco.peers.gossip.publishing import Publisher

log = logging.getLogger(__name__)
COUNTED = ("claims", "momentum_scaled", "held", "bounded")
"""Figures of a verdict counted over the island's life, for its summary."""


@dataclass(frozen=True)
class Folded:
    """The checks' verdicts on one state, folded."""

    refusal: Verdict | None
    """The first refusal (None: admitted)."""
    weight: float
    """The weight it is mixed with: the base weight, capped, times the factors."""
    base: float
    """Its weight by tokens and staleness alone."""
    momentum_scale: float
    figures: dict
    far: bool
    """A check found it far from this island (when it is also far ahead, the island catches up)."""


class Admission:
    """The checks of partners' states for one island (see the module docstring)."""

    def __init__(self, checks: Sequence[Check], identity: Identity, outer: OuterLoop, chooser: PartnerChooser,
                 publisher: Publisher, members: Callable[[], Mapping[str, IslandRecord]],
                 ledger: PartnerLedger | None = None, catch_up: Callable[[str, int], None] = lambda peer, version: None,
                 stale_lag: int = 3) -> None:
        """`catch_up(peer, version)`: start catching up, `peer`'s state at `version` having shown this
        island `stale_lag` or more versions behind."""
        if not checks or checks[0].name != "identity":
            raise ValueError("an admission's first check reads the state's identity")
        self.checks = list(checks)
        self.identity, self.outer, self.chooser, self.publisher = identity, outer, chooser, publisher
        self.members, self.catch_up, self.stale_lag = members, catch_up, stale_lag
        self.ledger = PartnerLedger(identity.name) if ledger is None else ledger
        self.last_refused: str | None = None
        self.counts: Counter[str] = Counter()
        """How many states each figure of `COUNTED` was reported for."""

    def admit(self, result: FetchResult) -> Outcome:
        """The outcome of an exchange that ended, fetched or pushed (see the module docstring)."""
        figures = {"partner": result.peer_id, "fetch_s": round(result.seconds, 3), "wait_s": round(result.waited_s, 3),
                   "bytes_in": result.nbytes}
        if result.snapshot is None:
            if result.cancelled:
                return Cancelled({**figures, "cancelled": result.error})
            figures["fetch_error"] = result.error
            if result.bad_state:
                return self.refuse(result.peer_id, str(result.error), figures)
            self.chooser.failed(result.peer_id)
            return Failed(str(result.error), figures)
        if not result.pushed:
            self.chooser.succeeded(result.peer_id, result.nbytes, result.seconds)
        candidate = Candidate(result.peer_id, result.snapshot, measured=result.measured)
        folded = self.fold(candidate, lambda c: self._read(c, result))
        figures.update(folded.figures)
        if folded.far and candidate.state.version >= self.outer.state.version + self.stale_lag:
            self.catch_up(result.peer_id, candidate.state.version)  # this island may be the stale one
            figures["caught_up"] = True
        if folded.refusal is not None:
            return self._refused(result.peer_id, folded.refusal, figures)
        self.chooser.mixed(result.peer_id)
        return Admitted(replace(candidate.state, cap=folded.weight, m_scale=folded.momentum_scale), folded.weight,
                        figures)

    @property
    def refused(self) -> int:
        """States refused, every partner's (the ledger's)."""
        return sum(entry.refused for entry in self.ledger.entries.values())

    def fold(self, candidate: Candidate, read: Callable[[Candidate], str | None] = lambda c: None) -> Folded:
        """Run the checks on `candidate` in order and fold their verdicts (see the module docstring);
        `read(candidate)` reads its state once `identity` passed, and says why it cannot (None: it could)."""
        island = Island(self.outer, self.ledger, self.identity, self.members, None)
        base = cap = factor = scale = 1.0
        figures: dict = {}
        far = False
        weighed = False
        for check in self.checks:
            if not weighed and check.name != "identity":
                if candidate.state is None and (why := read(candidate)) is not None:
                    return Folded(Verdict(refused=why, never_again=True), 0.0, 0.0, 1.0, figures, False)
                island = replace(island, progress=self.outer.progress())  # (a pass over the weights before a first step)
                base = candidate.weight = self._base(candidate.state)
                weighed = True
            verdict = check.judge(candidate, island)
            figures.update(verdict.figures)
            far = far or verdict.far
            if verdict.refused is not None:
                self._count(figures)
                return Folded(verdict, 0.0, base, scale, figures, far)
            if verdict.counted is not None:
                version, tokens = verdict.counted
                candidate.state = replace(candidate.state, version=version, tokens=tokens)
                base = self._base(candidate.state)
            cap, scale = min(cap, verdict.cap), min(scale, verdict.momentum_scale)
            factor *= verdict.factor
            candidate.weight = min(base, cap) * factor
        weight = max(0.0, candidate.weight)
        if 0 < base and weight < base:
            figures["bounded"] = True
        self._count(figures)
        return Folded(None, weight, base, scale, figures, far)

    def _base(self, state: PartnerState) -> float:
        """The weight of `state` by its tokens and staleness (`core.outer.mixing_weight`)."""
        s = self.outer.state
        return mixing_weight(self.outer.cfg, s.version, s.tokens, state)

    def _read(self, candidate: Candidate, result: FetchResult) -> str | None:
        """Read the candidate's mixable state from its snapshot; why it cannot be (None: it was)."""
        anchor = self.outer.state.phi
        try:
            held = self.publisher.public_side.own() if result.public is not None else contextlib.nullcontext()
            with held as own:  # (at one version: the publishing thread advances it)
                candidate.state = partner_state(result.snapshot, anchor.numel(), self.identity.model,
                                                self.identity.run, public=result.public, own_public=own, anchor=anchor)
        except TransportError as e:  # a state that does not fit this model never will
            return str(e)
        return None

    def _refused(self, peer: str, verdict: Verdict, figures: dict) -> Refused:
        if verdict.never_again:
            self.chooser.exclude(peer)
        return self.refuse(peer, str(verdict.refused), figures, verdict.foreign)

    def _count(self, figures: dict) -> None:
        self.counts.update(key for key in COUNTED if key in figures)

    def refuse(self, peer: str, why: str, figures: dict | None = None, foreign: str | None = None) -> Refused:
        """A partner's state is not mixed: count it, back the partner off (or set it aside), say why."""
        figures = {} if figures is None else figures
        self.last_refused = peer
        self.ledger[peer].refused += 1
        aside = self.chooser.refused(peer)
        log.warning("refused the state of %s: %s%s", label_among(self.members(), peer), why,
                    "" if aside is None else f"; not choosing it for {aside:.0f} s")
        figures["refused"] = why
        return Refused(why, figures, foreign)

    def mixed(self, peer: str, weight: float) -> None:
        """The state admitted for `peer` was weighed, and mixed with `weight` (0: it was not)."""
        for check in self.checks:
            if isinstance(check, Remembers):
                check.mixed(peer, weight, self.ledger)

    def own_round(self, tokens: int) -> None:
        """One of this island's rounds ended, having trained `tokens`."""
        for check in self.checks:
            if isinstance(check, Remembers):
                check.own_round(tokens)
