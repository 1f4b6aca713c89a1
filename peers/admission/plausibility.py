"""Is a partner's state a partner's at all? A state as far from this island's as its weights are large.

Digests, sizes and finiteness prove a state arrived as it was sent, not that it is sane: a member
holding the secret can publish its weights times 1e6, a random state or another run's state. Honest
partners' anchors sit close to this island's own: they started from the same weights and mix with
each other. So the gate refuses a state whose relative distance `r = |phi_j - phi_i| / |phi_i|` (of
the whole difference, for a public state) exceeds `GateSettings.bound` (1.0: a random or another
run's state lands near sqrt 2): what no honest partner sends, however long it trained apart.

Everything nearer is admitted and bounded, not refused: its mix's move is clipped around this
island's own state (`clip`), its sender's record weighs it (`trust`), and so on. (Until issue 46 the
gate learned its bound from the distances of the states it accepted, 8 times their median, and
widened it while the island mixed nothing: honest islands that trained apart, behind a slow or broken
link, refused each other as implausible for the rest of their run. BENCHMARKS.md, "Robustness".)
"""

from __future__ import annotations

import math

from p2p_diloco.admission import GateSettings
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict


class PlausibilityGate:
    """`gate`: the relative distance a partner's state must keep (see the module docstring)."""

    name = "gate"

    def __init__(self, settings: GateSettings | None = None) -> None:
        self.s = settings or GateSettings()

    def judge_distance(self, r: float | None) -> str | None:
        """None when a state at relative distance `r` may be mixed, else why not."""
        if r is None or (math.isfinite(r) and r <= self.s.bound):
            return None
        return f"implausible: {r:.3g} x this island's weights away, the bound is {self.s.bound:.3g}"

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        why = None if candidate.measured is None else self.judge_distance(candidate.measured.distance)
        return ADMIT if why is None else Verdict(refused=why, far=True)
