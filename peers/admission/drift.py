"""A memory of what the partners' mixes moved this island: a slow drift is seen over time, whoever pushes it.

A member that adds a fixed direction growing by half the median distance of honest states, a little
more each round, passes every bound of one state, and the loss probe sees nothing a single mix does
(+1.9% on the worst honest island, BENCHMARKS.md "The quiet members"); two members that push the
same direction each look half as guilty. What sets them apart is over time: honest partners'
differences from this island come and go (each mix closes half of one, and each round opens a new
one in a direction of its own), so the sum of what all partners' mixes moved the island stays within
a few of their moves; a drift's keeps growing along one direction, however many members share it.

So the island keeps one sum `S` of what every partner's mixes moved its anchor, less the part along
its own progress (its momentum: a partner a version ahead pushes along it every time, and honestly),
decayed by `decay` at each mix so that the distant past fades. A new state moving the anchor by
`a c` is mixed with `a` at most `(rounds x D - <S, c>/|c|) / |c|` (`D`: the island's own progress
per round, `core.influence`): the sum's part along the new move, plus the move, stays within `rounds`
rounds of progress, and never below what the decay frees at a mix, `rounds x (1 - decay)` (0.4)
rounds: a state is never refused here, a push that keeps one way is mixed ever more lightly. (Kept
per partner until issue 46, two members colluding on one direction moved the honest islands by
twice the bound, and the sum's refusal refused honest islands that had trained apart.)

The vectors are count sketches (`peers.gossip.measure.Sketcher`), filled in the same pass over the
state that measures it as it arrives; its random signs are drawn afresh by every process, so no
member can aim a direction at what they lose. `rounds` and `decay` are
`p2p_diloco.admission.DriftSettings`' fields.
"""

from __future__ import annotations

import torch

from p2p_diloco.admission import DriftSettings
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict
from p2p_diloco.peers.gossip.measure import Sketcher


class DriftCheck:
    """`drift`: what the partners' mixes moved this island, together (see the module docstring)."""

    name = "drift"

    def __init__(self, settings: DriftSettings | None = None) -> None:
        self.s = settings or DriftSettings()
        self.sum: torch.Tensor | None = None
        """A sketch of what the partners' mixes moved the island, decayed at each mix."""

    @staticmethod
    def along(past: torch.Tensor | None, move: torch.Tensor) -> float:
        """How far the moves summed in `past` went along `move`'s direction (anchor units)."""
        size = float(move.norm())
        return 0.0 if past is None or size == 0 else float(past @ move) / size

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        """The most weight the state, moving the anchor by `a move` (a sketch), may be mixed with."""
        move, d = None if candidate.measured is None else candidate.measured.move, island.progress
        if move is None or not d:
            return ADMIT
        island.ledger[candidate.peer].pending = move
        size, past = float(move.norm()), self.along(self.sum, move) * self.s.decay
        if size == 0:
            return Verdict(figures={"drift": round(past / d, 3)})
        cap = max(self.s.rounds * d - past, self.s.rounds * (1 - self.s.decay) * d) / size
        return Verdict(cap=min(1.0, cap), figures={"drift": round(past / d, 3)})

    def mixed(self, peer: str, weight: float, ledger: PartnerLedger) -> None:
        """`peer`'s admitted state was mixed with `weight` (0: it was not): its move joins the sum."""
        entry = ledger[peer]
        move, entry.pending = entry.pending, None
        if move is not None and weight > 0:
            self.sum = (Sketcher.empty() if self.sum is None else self.sum.mul_(self.s.decay)).add_(move, alpha=weight)

    def own_round(self, tokens: int) -> None:
        pass
