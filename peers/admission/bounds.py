"""The checks that read what a state's arrival measured against the island's own rounds.

Each judges one of the bounds of `core.influence`, all measured in `D`, the norm of the island's own
pseudo-gradient over a round (`island.progress`): `momentum` (a momentum beyond what honest
pseudo-gradients sum to is refused, one beyond the island's own is mixed scaled down) and `clip`
(the weight cut so that a mix moves the anchor by at most `clip` rounds). `identity` comes first of
all: a state of another model or run is refused, its sender never chosen again.
"""

from __future__ import annotations

from p2p_diloco.discovery.records import label_among
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict


class IdentityCheck:
    """`identity`: the state's manifest names this island's model and run (`Identity.foreign`)."""

    name = "identity"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        foreign = island.identity.foreign(candidate.snapshot.meta)
        if foreign is None:
            return ADMIT
        kind, why = foreign
        return Verdict(refused=f"snapshot from {candidate.snapshot.endpoint} is for {why}", never_again=True,
                       foreign=kind, figures={"foreign": kind})


class MomentumCheck:
    """`momentum`: refused beyond `momentum_ratio x D / (1 - mu)`, scaled to `momentum_clip` times the
    island's own momentum's norm beyond that (`InfluenceBound.momentum`, `momentum_scale`)."""

    name = "momentum"

    def __init__(self) -> None:
        self.scaled = 0
        """Partners' momenta mixed at the learned bound."""

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m = candidate.measured
        if m is None:
            return ADMIT
        bound = island.outer.influence
        if (why := bound.momentum(m.momentum, island.progress)) is not None:
            return Verdict(refused=why, far=True)
        scale = bound.momentum_scale(m.momentum)
        if scale >= 1:
            return ADMIT
        self.scaled += 1
        island.ledger.say_once(candidate.peer, label_among(island.members(), candidate.peer), "momentum",
                               f"its momentum is {1 / scale:.2f} x the bound learned from this island's own "
                               f"momenta; mixed at the bound")
        return Verdict(momentum_scale=scale, figures={"momentum_scaled": round(scale, 4)})


class ClipCheck:
    """`clip`: the weight at most `clip x D / gap`, so that a mix moves the anchor by `clip` rounds at
    most (self-centred clipping: `core.influence`; the gap less what the state's encoding rounded
    off, `Measured.trained`). A state `far_rounds` away and `stale_lag` versions ahead shows this
    island stale (`far`: it catches up, `peers.state.source.CatchingUp`), and is mixed clipped meanwhile."""

    name = "clip"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m, d, bound = candidate.measured, island.progress, island.outer.influence
        if m is None:
            return ADMIT
        away = None if not d else m.trained / d
        behind = bound.rounds_behind(m.along)
        figures = {"distance": round(m.distance, 6), **({} if away is None else {"rounds_away": round(away, 3)}),
                   **({} if behind is None else {"behind": round(behind, 3)})}
        far = away is not None and away > bound.s.far_rounds
        return Verdict(cap=bound.clip(m.trained, d), figures=figures, far=far)
