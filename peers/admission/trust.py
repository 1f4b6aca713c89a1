"""Each partner's record: how far its states sit beyond where the swarm's states sit, over time.

One state of a member that stays inside the honest spread ("a little is enough", Baruch et al. 2019:
per coordinate, the honest mean shifted by a fraction of their spread against the swarm's progress)
or that sends a small negative multiple of the swarm's change (inner product manipulation) passes
every bound of one state; what sets it apart is that its states sit back along the island's progress
time after time. Like CenteredClip's and BTARD's history term, and Templar's Gauntlet, which smooths
each peer's score over time, the island keeps a record per partner (in its ledger): the average, over
that partner's states (each keeping `memory` of the one before), of how far each state sat

- back along the island's progress (`core.influence.InfluenceBound.rounds_behind`) beyond what its
  version's lag explains, and
- away from the island's anchor (in rounds of its progress, beyond its lag),

beyond the swarm's typical state: the median of each over the last `history` states of all partners
(so that honest islands that all moved apart together, after a partition, count as typical). A
partner whose average excess is within `slack` rounds is mixed as it comes; beyond, its weight is
multiplied by `slack / excess`: a state 2 rounds further back than the others is mixed at a quarter
of its weight, and keeps a quarter while its record lasts. Nothing is refused: honest differences
come and go, and a partner whose states come back to the typical regains its weight within a few.
"""

from __future__ import annotations

import statistics
from collections import deque

from p2p_diloco.admission import TrustSettings
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict

MIN_TYPICAL = 4
"""States seen before the swarm's typical place is read from them (before, no state is held beyond it)."""


class TrustCheck:
    """`trust`: the partners' records (see the module docstring)."""

    name = "trust"

    def __init__(self, settings: TrustSettings | None = None) -> None:
        self.s = settings or TrustSettings()
        self.behind: deque[float] = deque(maxlen=self.s.history)
        """The swarm's last states' rounds back along the island's progress beyond their lag."""
        self.away: deque[float] = deque(maxlen=self.s.history)
        """... and their rounds away from its anchor beyond their lag."""

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m, d = candidate.measured, island.progress
        behind = None if m is None else island.outer.influence.rounds_behind(m.along)
        if behind is None or not d:
            return ADMIT
        lag = max(0, island.outer.state.version - candidate.state.version)
        behind, away = behind - lag, m.trained / d - lag
        excess = self._beyond(behind, self.behind) + self._beyond(away, self.away)
        self.behind.append(behind)
        self.away.append(away)
        entry = island.ledger[candidate.peer]
        entry.pull = excess if entry.pull is None else self.s.memory * entry.pull + (1 - self.s.memory) * excess
        if entry.pull <= self.s.slack:
            return Verdict(figures={"pull": round(entry.pull, 3)})
        return Verdict(factor=self.s.slack / entry.pull, figures={"pull": round(entry.pull, 3), "held": True})

    def restart(self) -> None:
        """The island adopted another state whole (a catch-up): the swarm's typical place starts over."""
        self.behind.clear()
        self.away.clear()

    @staticmethod
    def _beyond(x: float, typical: deque[float]) -> float:
        return 0.0 if len(typical) < MIN_TYPICAL else max(0.0, x - statistics.median(typical))
