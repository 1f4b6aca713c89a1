"""Judge a partner's state by what its mix does: a held-out loss with and without it.

Where a state sits (`peers.admission.plausibility`, `core.influence`) cannot tell every broken or hostile
member from an honest one: a member whose training is stuck publishes weights a few rounds old, one
that reverses its last change publishes weights a round or two back, and both sit as close to the
island as honest partners do early in a run, when every round moves the weights far. What the mix
does tells them apart: like Templar's Gauntlet, which scores a peer by the loss before and after
its contribution, the island evaluates a few fixed held-out batches (not those of its eval loss, so
that the eval loss stays an honest measure) on its running weights, then with the partner's mix
applied as it would be (`a (phi_j - phi_i)` at the weight the bounds allow), and takes the mix back.
A state whose mix raises that loss by more than a tolerance (`FLOOR` of it, or half of what the
island's own rounds lower it by lately, whichever is larger: early in a run honest mixes raise it by
several percent, as much as a round of training lowers it) is mixed with its weight cut in
proportion, so that it raises the loss by the tolerance at most (half that for a partner cut the
time before, a quarter after two cuts running, ...): not refused, since an honest
partner trained on other data raises this island's loss as well (by 4-12% in `bench attack`'s
`other-data` row), and must still be mixed. A mix that makes the loss non-finite is refused.

The probe runs on the training thread, between inner steps, for every state that passed the other
checks: two forward passes over the probe batch and two passes over the weights, no copy of them
(BENCHMARKS.md, "Judged by effect", measures its cost and what it buys). An island without a probe
(`probe_fn=None` in the API) skips it. `FLOOR`, `ROUNDS`, `START` and `WINDOW` are
`p2p_diloco.admission.ProbeSettings`' fields; the cuts in a row are the ledger's `strikes`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from p2p_diloco.admission import ProbeSettings
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict

BASE_WEIGHT = 0.5
"""The weight a mix's effect is read at for the partner's record (`trust`): the loss is about linear
along a short mix, so a mix at a quarter of it raises the loss about a quarter as much."""
RECORD_MOST = 10.0
"""The most one mix's effect adds to a record, in the probe's tolerance."""

class EffectProbe:
    """`probe`: the probe loss of the island's running weights with and without a partner's mix."""

    name = "probe"

    def __init__(self, outer: OuterLoop, loss: Callable[[], float], settings: ProbeSettings | None = None) -> None:
        """`loss()`: the model's mean loss over fixed held-out batches, at its running weights."""
        self.outer, self.loss, self.s = outer, loss, settings or ProbeSettings()
        self.seen: deque[tuple[float, float]] = deque()
        """(when, in the island's rounds; the probe loss then) over the last `window` rounds."""

    def _when(self) -> float:
        return self.outer.state.version + self.outer.round_steps / max(1, self.outer.cfg.local_steps)

    def progress(self) -> float | None:
        """The relative drop of the probe loss per round over the last rounds (None: less than a round seen)."""
        if not self.seen:
            return None
        (t0, first), (t1, last) = self.seen[0], self.seen[-1]
        return None if t1 - t0 < 1.0 else (first - last) / last / (t1 - t0)

    def tolerance(self) -> float:
        """How much a mix may raise the probe loss now, relative to it."""
        p = self.progress()
        return self.s.start if p is None else max(self.s.floor, self.s.rounds * p)

    def _saw(self, loss: float) -> None:
        now = self._when()
        self.seen.append((now, loss))
        while len(self.seen) > 2 and now - self.seen[1][0] >= self.s.window:
            self.seen.popleft()

    def effect(self, partner: PartnerState, a: float) -> float | None:
        """How much mixing `partner` now with weight `a` would change the probe loss, relative to it
        (None: it would not be mixed, or the loss is not finite)."""
        if a <= 0:
            return None
        before = self.loss()
        self.outer.shift_running(partner, a)
        try:
            after = self.loss()
        finally:
            self.outer.shift_running(partner, -a)
        if not (math.isfinite(before) and before > 0):
            return None
        self._saw(before)
        return (after - before) / before if math.isfinite(after) else math.inf

    def cut(self, effect: float | None, strikes: int) -> float:
        """The factor on the mix's weight that keeps its effect within the tolerance (1: none needed),
        for a partner whose last `strikes` mixes were cut. Along the line from the running weights to
        the mixed ones the loss is about convex, so a weight cut by `tolerance / effect` raises it by
        at most the tolerance. A partner cut `n` times in a row is held to `2^-n` of the tolerance:
        an honest one is seldom cut twice running, a stuck, reversed or other-data one each time."""
        bound = self.tolerance()
        if effect is None or effect <= bound:
            return 1.0
        return bound / 2 ** strikes / effect

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        effect = self.effect(candidate.state, candidate.weight)
        if effect is None:
            return ADMIT
        if not math.isfinite(effect):
            return Verdict(refused="harmful: mixing it makes this island's probe loss non-finite")
        entry, tolerance = island.ledger[candidate.peer], self.tolerance()
        factor = self.cut(effect, entry.strikes)
        entry.strikes = 0 if factor == 1.0 else entry.strikes + 1
        # the partner's record takes it in (`trust`), as at the base weight: a weight its record cut is no excuse
        entry.probed = min(RECORD_MOST, max(0.0, effect) / tolerance * BASE_WEIGHT / max(candidate.weight, 1e-6))
        return Verdict(factor=factor, figures={"probe": round(effect, 5)})
