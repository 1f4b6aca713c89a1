"""Is a partner's state plausible enough to mix? A distance gate learned from the swarm's own states.

Digests, sizes and finiteness prove a state arrived as it was sent, not that it is sane: a member
holding the secret can publish its weights times 1e6, a random state or another run's state, and
mixing one of those with weight 0.5 destroys the island. Honest partners' anchors sit close to
this island's own: they started from the same weights and mix with each other every round. So the
gate measures the relative distance `r = |phi_j - phi_i| / |phi_i|` of every fetched state and
refuses one far outside the distances of the states it accepted recently:

- before `MIN_HISTORY` accepted states: `r` within a few of the island's own rounds of progress
  (`START_ROUNDS`), or, before its first outer step, `r <= START_BOUND` (a state as
  far from ours as our own weights are large is no partner's; a random or another run's state
  lands near sqrt(2));
- then `r <= max(RATIO x median, median + SPREAD x 1.4826 x MAD)` over the last `HISTORY` accepted
  distances, robust to the few outliers that get through.

The distance is computed on the gossip worker's thread as the state arrives (`peers.gossip.measure`), so a
refused state costs the training loop nothing; a refused partner backs off and, refused again and
again, is never chosen again (`PartnerChooser.refused`). The constants named here are
`p2p_diloco.admission.GateSettings`' fields (`START_ROUNDS`: `BoundsSettings.start_rounds`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from p2p_diloco.admission import GateSettings
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict

class PlausibilityGate:
    """`gate`: the bound a partner state's relative distance must keep (see the module docstring)."""

    name = "gate"

    def __init__(self, settings: GateSettings | None = None) -> None:
        self.s = settings or GateSettings()
        self.accepted: deque[float] = deque(maxlen=self.s.history)

    def median(self) -> float | None:
        """The median accepted distance (None: none accepted yet)."""
        return statistics.median(self.accepted) if self.accepted else None

    def bound(self) -> float:
        if len(self.accepted) < self.s.min_history:
            return self.s.start_bound
        med = statistics.median(self.accepted)
        mad = statistics.median(abs(r - med) for r in self.accepted)
        return max(self.s.ratio * med, med + self.s.spread * 1.4826 * mad)

    def judge_distance(self, r: float | None, start: float | None = None, apart: float = 0.0) -> str | None:
        """None when a state at distance `r` may be mixed (and remembers `r`), else why not. `start`:
        the bound before distances were learned, from the island's own progress (`core.influence`;
        None: `start_bound`); `apart`: what the learned bound widens by while the island mixes
        nothing (`InfluenceBound.apart_distance`)."""
        if r is None:
            return None
        learned = len(self.accepted) >= self.s.min_history or start is None
        bound = self.bound() + apart if learned else min(start, self.s.start_bound)
        if not math.isfinite(r) or r > bound:
            return f"implausible: {r:.3g} x this island's weights away, the bound is {bound:.3g}"
        self.accepted.append(r)
        return None

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        m = candidate.measured
        if m is None:
            return ADMIT
        bound, d = island.outer.influence, island.progress
        why = self.judge_distance(m.distance, bound.start_bound(d, m.anchor_norm, m.noise),
                                  bound.apart_distance(d, m.anchor_norm))
        return ADMIT if why is None else Verdict(refused=why, far=True)

    def restart(self) -> None:
        """Forget the distances learned (the island adopted another state: a catch-up)."""
        self.accepted.clear()
