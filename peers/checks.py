"""Every check a partner's state gets before it is mixed, and what a refusal does.

A state that arrived, fetched or pushed, is mixable only when its bytes checked out on the way
(digests, sizes, finite values: `exchange.payload`), it is of this island's model and run
(`peers.gossip.partner_state`), with its claims (version, tokens) counted as far as they can be
checked (`peers.claims`), its distance from this island's anchor is plausible
(`peers.plausibility`), its momentum and its place along the island's progress keep the
bounds of `core.influence` (which also bounds the weight it is mixed with and its momentum), and
what its sender's past mixes moved the island keeps the bound of `peers.drift`; where the island has a
probe, a weight whose mix would raise a held-out loss is cut (`peers.probe`). A refused state is
counted and logged, and its sender backs off, or is never chosen again (`PartnerChooser`). A state refused as too far while far ahead may mean that
this island is the stale one: it then catches up from the freshest members on a thread of its own
(`peers.state.CatchUp`), training on meanwhile.

`PartnerChecks` owns the gate, the catch-up and the refusal counts; the island's round asks it
(`admit`) and mixes what it returns.
"""

from __future__ import annotations

import contextlib

import logging
import math
from collections.abc import Callable
from dataclasses import replace

from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.discovery.records import label_among
from p2p_diloco.errors import ForeignState, TransportError
from p2p_diloco.peers.claims import TOKEN_RATE, VERSION_AHEAD, ClaimBounds, median_version
from p2p_diloco.peers.drift import DriftMemory
from p2p_diloco.peers.gossip import FetchResult, partner_state
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.partners import PartnerChooser
from p2p_diloco.peers.plausibility import Measured, PlausibilityGate
from p2p_diloco.peers.probe import EffectProbe
from p2p_diloco.peers.publishing import Publisher
from p2p_diloco.peers.state import STALE_LAG, CatchUp, StateSource

log = logging.getLogger(__name__)


class PartnerChecks:
    """The checks of partners' states for one island (see the module docstring)."""

    def __init__(self, identity: Identity, outer: OuterLoop, chooser: PartnerChooser, publisher: Publisher,
                 source: StateSource, probe_fn: Callable[[], float] | None = None) -> None:
        """`probe_fn()`: the model's loss over fixed held-out batches (`peers.probe`; None: no probe)."""
        self.identity, self.outer, self.chooser, self.publisher, self.source = identity, outer, chooser, publisher, source
        self.probe = None if probe_fn is None else EffectProbe(outer, probe_fn)
        """Judges a state by its mix's effect on a held-out loss, after every other check (None: not)."""
        self.gate = PlausibilityGate()
        self.claims = ClaimBounds(lambda: median_version(self.source.membership.members()))
        self.catch_up: CatchUp | None = None
        """The download of the freshest states, while this island catches up."""
        self.drift = DriftMemory()
        self.refused = 0
        self.last_refused: str | None = None
        self.momenta_scaled = 0
        """Partners' momenta mixed at the learned bound (`core.influence.InfluenceBound.momentum_scale`)."""
        self._said: set[tuple[str, str]] = set()

    def admit(self, result: FetchResult) -> tuple[PartnerState | None, dict]:
        """The state of an exchange that ended (fetched, or pushed to this island), if it may be mixed,
        and the exchange's figures for the round's row."""
        info = {"partner": result.peer_id, "fetch_s": round(result.seconds, 3), "wait_s": round(result.waited_s, 3),
                "bytes_in": result.nbytes}
        if result.snapshot is None:
            if result.cancelled:  # this island gave it up (`--exchange auto`): no fault of the partner's
                info["cancelled"] = result.error
                return None, info
            info["fetch_error"] = result.error
            if result.bad_state:
                return self.refuse(result.peer_id, result.error, info)
            self.chooser.failed(result.peer_id)
            return None, info
        if not result.pushed:
            self.chooser.succeeded(result.peer_id, result.nbytes, result.seconds)
        anchor = self.outer.state.phi
        try:
            held = self.publisher.own_public() if result.public is not None else contextlib.nullcontext()
            with held as own:  # (at one version: the publishing thread advances it)
                state = partner_state(result.snapshot, anchor.numel(), self.identity.model, self.identity.run,
                                      public=result.public, own_public=own, anchor=anchor)
        except TransportError as e:  # another model or run: it never changes, so never again
            self.chooser.exclude(result.peer_id)
            if isinstance(e, ForeignState):
                info["foreign"] = e.kind
            return self.refuse(result.peer_id, str(e), info)
        state = self._counted(state, result.peer_id, info)
        measured, d = result.measured, self.outer.progress()  # (a pass over the weights before the first outer step)
        why = self.judge(state, measured, d)
        if why is not None:
            if state.version >= self.outer.state.version + STALE_LAG:
                self.catch_up_from(result.peer_id, state.version)  # this island may be the stale one
                info["caught_up"] = True
            return self.refuse(result.peer_id, why, info)
        if measured is not None:
            info["distance"] = round(measured.distance, 6)
            state = replace(state, gap=measured.trained)
            info.update(self.figures(measured, d))
            state, why = self._bounded(state, measured, d, result.peer_id, info)
            if why is not None:
                return self.refuse(result.peer_id, why, info)
        if self.probe is not None:  # what the mix would do (`peers.probe`)
            effect = self.probe.effect(state)
            if effect is not None and not math.isfinite(effect):
                return self.refuse(result.peer_id, "harmful: mixing it makes this island's probe loss non-finite", info)
            if effect is not None:
                info["probe"] = round(effect, 5)
                state = replace(state, cut=self.probe.cut(effect, result.peer_id))
        self.chooser.mixed(result.peer_id)
        return state, info

    def _counted(self, state: PartnerState, peer_id: str, info: dict) -> PartnerState:
        """`state` with its claims counted as far as this island can check them (`peers.claims`)."""
        version, tokens, clipped = self.claims.count(self.outer.state.version, state.version, state.tokens)
        if clipped is None:
            return state
        info["claims"] = clipped
        self._say_once("claims", peer_id, f"it claims more than this island can check ({clipped}; versions at most "
                       f"{VERSION_AHEAD} ahead of the members' median, tokens at most {TOKEN_RATE:g} of this "
                       f"island's rounds per version): counted as clipped")
        return replace(state, version=version, tokens=tokens)

    def _bounded(self, state: PartnerState, measured: Measured, d: float | None, peer_id: str,
                 info: dict) -> tuple[PartnerState, str | None]:
        """`state` with its weight capped by what its sender's past mixes moved this island (`peers.drift`)
        and its momentum by the island's own (`core.influence`), or why it is refused."""
        cap, drift, why = self.drift.judge(peer_id, measured.move, d)
        if drift is not None:
            info["drift"] = round(drift, 3)
        if why is not None:
            return state, why
        state = replace(state, cap=cap, m_scale=self.outer.influence.momentum_scale(measured.momentum))
        if state.m_scale < 1:
            self.momenta_scaled += 1
            info["momentum_scaled"] = round(state.m_scale, 4)
            self._say_once("momentum", peer_id, f"its momentum is {1 / state.m_scale:.2f} x the bound learned from "
                           f"this island's own momenta; mixed at the bound")
        return state, None

    def own_round(self, tokens: int) -> None:
        """One of this island's rounds ended, having trained `tokens`."""
        self.claims.own_round(tokens)

    def mixed(self, peer_id: str, weight: float) -> None:
        """The state `admit` returned for `peer_id` was weighed, and mixed with `weight` (0: it was not)."""
        self.drift.mixed(peer_id, weight)

    def _say_once(self, what: str, peer_id: str, message: str) -> None:
        if (what, peer_id) not in self._said:
            self._said.add((what, peer_id))
            log.warning("%s: %s: %s (said once for it; counted in the summary)", self.identity.name,
                        label_among(self.source.membership.members(), peer_id), message)

    def judge(self, state: PartnerState, measured: Measured | None, d: float | None) -> str | None:
        """Why a state that fits this island's model and run is refused (None: it may be mixed): its
        momentum, where it sits along this island's progress (`core.influence`), its distance (the
        gate, whose start bound is the island's own progress); `d`: `OuterLoop.progress()`."""
        if measured is None:
            return None
        bound, lag = self.outer.influence, self.outer.state.version - state.version
        return (bound.momentum(measured.momentum, d) or bound.size(measured.norm, measured.anchor_norm, d, lag)
                or bound.behind(measured.along, lag)
                or self.gate.judge(measured.distance, bound.start_bound(d, measured.anchor_norm, measured.noise),
                                   bound.apart_distance(d, measured.anchor_norm)))

    def figures(self, measured: Measured, d: float | None) -> dict:
        """Where an admitted state sits, in the island's own rounds of progress `d`, for the round's
        row: its distance (`rounds_away`) and how far back along the progress (`behind`)."""
        behind = self.outer.influence.rounds_behind(measured.along)
        out = {} if not d else {"rounds_away": round(measured.trained / d, 3)}
        return out if behind is None else {**out, "behind": round(behind, 3)}

    def refuse(self, peer_id: str, why: str, info: dict) -> tuple[None, dict]:
        """A partner's state is not mixed: count it, tell the dashboard, back the partner off (or drop it)."""
        self.refused += 1
        self.last_refused = peer_id
        aside = self.chooser.refused(peer_id)
        log.warning("refused the state of %s: %s%s", label_among(self.source.membership.members(), peer_id), why,
                    "" if aside is None else f"; not choosing it for {aside:.0f} s")
        info["refused"] = why
        return None, info

    def catch_up_from(self, peer_id: str, version: int) -> None:
        """Far behind the swarm (resumed after a long absence, or stalled), a state that far ahead is
        legitimately far from this island's anchor, but a claimed version proves nothing (the state
        is still refused, and counted); so the island rejoins as a newcomer does, adopting the state
        most of the freshest members agree on (`adopt_caught_up`)."""
        if self.catch_up is None:
            log.warning("%s is at version %d, %s at %d: catching up from the freshest members",
                        self.identity.name, self.outer.state.version,
                        label_among(self.source.membership.members(), peer_id), version)
            self.catch_up = CatchUp(self.source, ahead=peer_id)

    def adopt_caught_up(self) -> int | None:
        """Between inner steps: adopt what a finished catch-up downloaded (the plausibility history and
        the public state start over there). Returns the bytes it downloaded, or None while nothing
        was adopted."""
        states = None if self.catch_up is None else self.catch_up.take()
        if states is None:
            return None
        self.catch_up = None
        if not states:
            log.warning("%s could not catch up: no member's state could be downloaded; it keeps its own",
                        self.identity.name)
            return None
        nbytes = self.source.adopt(states, started=True)
        self.publisher.restart_public()
        self.gate = PlausibilityGate()
        return nbytes
