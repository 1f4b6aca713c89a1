"""How far one partner may move an island: bounds learned from the island's own rounds.

Every bound is measured in `D`, the norm of the island's own pseudo-gradient over a round (the median
of its last `history` rounds, or the last if larger): what partners send does not move it, so no
partner widens a bound by being mixed, as it would widen one learned from the island's own anchor,
from the distances of the states it accepted, or from its momentum.

- **Clip** (self-centred clipping, as ClippedGossip clips each neighbour's difference around the
  node's own model, and BTARD's CenteredClip each peer's contribution around the centre): a
  partner's difference from the island's anchor is clipped so that a mix moves the anchor by at most
  `clip x D`; its weight `a` becomes `min(a, clip x D / |phi_j - phi_i|)`, the distance less what the
  state's encoding rounded off (`codecs.rounding_error`: int8 rounds a 124M state by about 0.5% of
  its norm, more than a round of warmup moves it). A state however far, honest or not, moves the
  island by a bounded amount; nothing is refused for where it sits.
- **Momentum**: refused when its norm exceeds `momentum_ratio x D / (1 - mu)`; an honest momentum
  sums pseudo-gradients decaying by mu, so its norm stays under `D / (1 - mu)`.
- **Momentum, learned**: whatever passes that is scaled down to at most `momentum_clip` times the
  island's own momentum's norm (the median of its last outer steps, or the last if larger): honest
  partners' momenta blend with one another every round, so their norms sit within a few tens of
  percent of the island's own, while one x3 passed the bound above and, blended at 0.5 and rescaled
  (`core.modes`), doubled the island's momentum at every mix it got (+1.8%, BENCHMARKS.md, "The quiet
  members").
- **Behind**: how many of the island's own rounds a state sits back along the direction it progresses
  in (its momentum), `rounds_behind`: what the partner's record (`peers.admission.trust`) reads.

Before the island's first outer step, `D` is the pseudo-gradient of the round so far, scaled to a
whole round (`core.island.OuterLoop.progress`); after it joined by adopting a state whole, it is read
from the momentum it took until its own rounds replace it (`adopted`). The constants are
`p2p_diloco.admission.BoundsSettings`' fields.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from p2p_diloco.admission import BoundsSettings


class InfluenceBound:
    """The island's own progress per round, and the bounds it sets (see the module docstring)."""

    def __init__(self, outer_momentum: float, settings: BoundsSettings | None = None) -> None:
        self.mu, self.s = outer_momentum, settings or BoundsSettings()
        self.deltas: deque[float] = deque(maxlen=self.s.history)
        """Norms of the island's own last pseudo-gradients."""
        self.momenta: deque[float] = deque(maxlen=self.s.history)
        """Norms of the island's own momentum after its last outer steps."""
        self.advances: deque[float] = deque(maxlen=self.s.history)
        """How far each of the island's own last outer steps moved the anchor along its momentum."""

    def own_round(self, delta_norm: float, advance: float | None = None, momentum_norm: float | None = None) -> None:
        """One outer step: its pseudo-gradient's norm, its advance along the momentum, the momentum's norm after it."""
        if math.isfinite(delta_norm) and delta_norm > 0:
            self.deltas.append(delta_norm)
        if momentum_norm is not None and math.isfinite(momentum_norm) and momentum_norm > 0:
            self.momenta.append(momentum_norm)
        if advance is not None and math.isfinite(advance) and advance > 0:
            self.advances.append(advance)

    def adopted(self, momentum_norm: float) -> None:
        """The island joined a running swarm by taking a state whole: until its own rounds are remembered, a
        round's progress is read from the momentum it took, `|m| sqrt(1 - mu^2)` (exact for rounds of
        one size in unrelated directions; rounds that agree sum to more, so this reads a round as up
        to 4.4x what it was at mu 0.9), not from its first rounds after it, which its inner optimizer's
        warmup keeps small: so a joiner does not clip the swarm it joined to its own first steps. The
        bounds are that much looser for the few rounds its own progress takes to outweigh it in the
        median; no partner state moves it otherwise, and the state adopted is the one most members
        agree on."""
        d = momentum_norm * math.sqrt(1 - self.mu**2)
        if math.isfinite(d) and d > 0:
            self.deltas.clear()
            self.deltas.append(d)
            self.momenta.clear()
            self.momenta.append(momentum_norm)

    def reference(self) -> float | None:
        """`D`, from the rounds remembered (None: no outer step yet): their median, or the last round's
        if larger (the rounds grow while the learning rate warms up)."""
        return max(statistics.median(self.deltas), self.deltas[-1]) if self.deltas else None

    def clip(self, gap: float | None, d: float | None) -> float:
        """The most weight a partner at distance `gap` from the anchor may be mixed with: `clip x d / gap`
        (1: no bound)."""
        if gap is None or d is None or gap <= 0:
            return 1.0
        return min(1.0, self.s.clip * d / gap)

    def momentum(self, norm: float | None, d: float | None) -> str | None:
        """Why a partner's momentum of this norm is refused (None: it is not)."""
        if norm is None or d is None:
            return None
        bound = self.s.momentum_ratio * d / (1 - self.mu)
        if math.isfinite(norm) and norm <= bound:
            return None
        return (f"implausible momentum: norm {norm:.3g}, the bound is {bound:.3g} ({self.s.momentum_ratio:g} x what "
                f"this island's own pseudo-gradients sum to)")

    def momentum_scale(self, norm: float | None) -> float:
        """The factor a partner's momentum of this norm is mixed with (1: as it came; see "Momentum,
        learned" in the module docstring)."""
        if norm is None or not self.momenta or not math.isfinite(norm) or norm <= 0:
            return 1.0
        bound = self.s.momentum_clip * max(statistics.median(self.momenta), self.momenta[-1])
        return min(1.0, bound / norm)

    def rounds_behind(self, along: float | None) -> float | None:
        """How many of the island's own rounds a state sits back along its progress (None: unknown)."""
        return None if along is None or not self.advances else along / statistics.median(self.advances)
