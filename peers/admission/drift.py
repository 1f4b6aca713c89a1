"""A memory of what each partner's mixes moved this island: a slow drift is seen over time.

Every bound of `core.influence` judges one state: how far it is, how large, how far back along
the island's progress. A member that adds a fixed direction growing by half the median distance
the gate accepts, a little more each round, passes each of them every time; the gate even learns
its distances, and the loss probe sees nothing a single mix does (+1.9% on the worst honest
island, BENCHMARKS.md "The quiet members"). What sets it apart is over time: honest partners'
differences from this island come and go (each mix closes half of one, and each round opens a new
one in a direction of its own), so the sum of what one partner's mixes moved the island stays
within a few of its moves; a drift's keeps growing along one direction.

So the island keeps, per partner, the sum `S` of what its mixes moved the anchor, less the part
along the island's own progress (its momentum: a partner a version ahead pushes along it every
time, and honestly), decayed by `DECAY` at each of that partner's mixes so that a member honest
for long is not held to its distant past. A new state moving the anchor by `a c` is mixed with
`a` at most `(DRIFT_ROUNDS x D - <S, c>/|c|) / |c|` (`D`: the island's own progress per round,
`core.influence`): the sum's part along the new move, plus the move, stays within `DRIFT_ROUNDS`
rounds; a state whose sum already reaches that is refused, said with the figures. A partner
that keeps pushing one way (a drift, or honest data of another kind) is mixed ever more lightly,
at most `DRIFT_ROUNDS x (1 - DECAY)` rounds per mix (0.4) once its sum reached the bound, however
often it is mixed. (Decayed at each of the island's own rounds instead, a member mixed every
third round kept 2.7 of the 4 rounds free at each of its mixes, and in a run of 12 rounds the cap
cut none of the drift's mixes: `bench attack`'s first run of it, BENCHMARKS.md.)

The vectors are kept as count sketches (`Sketcher`): `SKETCH_SIZE` numbers per partner, whatever
the model's size, filled in the same pass over the state that measures it as it arrives
(`peers.gossip.measure.measure`, on the gossip worker's thread). A sketch keeps inner products to
about `1 / sqrt(SKETCH_SIZE)` of the product of the norms; its random signs are drawn afresh by
every process, so no member can aim a direction at what they lose. Each partner's sum lives in the
island's ledger (`peers.admission.ledger`); `DRIFT_ROUNDS` and `DECAY` are
`p2p_diloco.admission.DriftSettings`' `rounds` and `decay`.
"""

from __future__ import annotations

import math

import torch

from p2p_diloco.admission import DriftSettings
from p2p_diloco.peers.gossip.measure import Sketcher
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict

class DriftCheck:
    """`drift`: per partner, what its mixes moved this island (see the module docstring)."""

    name = "drift"

    def __init__(self, settings: DriftSettings | None = None) -> None:
        self.s = settings or DriftSettings()

    @staticmethod
    def along(past: torch.Tensor | None, move: torch.Tensor) -> float:
        """How far the moves summed in `past` went along `move`'s direction (anchor units)."""
        size = float(move.norm())
        return 0.0 if past is None or size == 0 else float(past @ move) / size

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        """The most weight the state, moving the anchor by `a move` (a sketch), may be mixed with, so
        that its sender's mixes stay within `rounds` of progress along it; refused when they reach it."""
        move, d = None if candidate.measured is None else candidate.measured.move, island.progress
        if move is None or not d:
            return ADMIT
        entry = island.ledger[candidate.peer]
        size, past = float(move.norm()), self.along(entry.drift, move) * self.s.decay
        figures = {"drift": round(past / d, 3)}
        if past >= self.s.rounds * d:
            return Verdict(refused=f"drift: its earlier mixes moved this island {past / d:.1f} of its rounds of "
                                   f"progress along this state's direction, away from its own progress (bound "
                                   f"{self.s.rounds:g})", figures=figures)
        entry.pending = move
        cap = math.inf if size == 0 else (self.s.rounds * d - past) / size
        return Verdict(cap=min(1.0, cap), figures=figures)

    def mixed(self, peer: str, weight: float, ledger: PartnerLedger) -> None:
        """`peer`'s admitted state was mixed with `weight` (0: it was not): its move joins the sum."""
        entry = ledger[peer]
        move, entry.pending = entry.pending, None
        if move is not None and weight > 0:
            entry.drift = (Sketcher.empty() if entry.drift is None else entry.drift.mul_(self.s.decay)).add_(move, alpha=weight)

    def own_round(self, tokens: int) -> None:
        pass
