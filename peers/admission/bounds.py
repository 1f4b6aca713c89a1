"""The checks that read what a state's arrival measured against the island's own rounds.

Each judges one of the bounds of `core.influence`, all measured in `D`, the norm of the island's own
pseudo-gradient over a round (`island.progress`): `momentum` (a momentum beyond what honest
pseudo-gradients sum to is refused, one beyond the island's own is mixed scaled down), `size` (an
anchor's norm rounds of progress from the island's own), `behind` (a state back along the island's
progress beyond its lag) and `influence` (the weight cut so that a mix moves the anchor by at most
`clip` rounds). `identity` comes first of all: a state of another model or run is refused, its
sender never chosen again.
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


def _lag(candidate: Candidate, island: Island) -> int:
    return island.outer.state.version - candidate.state.version


class SizeCheck:
    """`size`: the anchor's norm within `size_rounds` (and a round a version of lag) of the island's own."""

    name = "size"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m = candidate.measured
        why = None if m is None else island.outer.influence.size(m.norm, m.anchor_norm, island.progress,
                                                                  _lag(candidate, island))
        return ADMIT if why is None else Verdict(refused=why, far=True)


class BehindCheck:
    """`behind`: at most `behind_rounds` back along the island's progress beyond the state's lag."""

    name = "behind"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m = candidate.measured
        if m is None:
            return ADMIT
        bound = island.outer.influence
        if (why := bound.behind(m.along, _lag(candidate, island))) is not None:
            return Verdict(refused=why, far=True)
        behind = bound.rounds_behind(m.along)
        return ADMIT if behind is None else Verdict(figures={"behind": round(behind, 3)})


class InfluenceCheck:
    """`influence`: the weight at most `clip x D / gap`, so that a mix moves the anchor by `clip` rounds
    at most (as BTARD's CenteredClip clips each peer's contribution around the centre; the gap less
    what the state's encoding rounded off, `Measured.trained`)."""

    name = "influence"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m, d = candidate.measured, island.progress
        if m is None:
            return ADMIT
        figures = {"distance": round(m.distance, 6), **({"rounds_away": round(m.trained / d, 3)} if d else {})}
        return Verdict(cap=island.outer.influence.clip(m.trained, d), figures=figures)
