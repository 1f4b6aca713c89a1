"""How far one partner may move an island: bounds learned from the island's own rounds.

The plausibility gate (`peers.admission.plausibility`) refuses a state far outside the distances the island
accepted before; what it lets through is mixed with weight `a`, so a member can place its state
anywhere inside that radius, or publish a plausible anchor beside an implausible momentum. Each
bound here is measured in `D`, the norm of the island's own pseudo-gradient over a round (the median
of its last `HISTORY` rounds, or the last if larger): what partners send does not move it, so no partner widens a bound by
being mixed, as it would widen one learned from the island's own anchor or momentum.

- **Influence** (as BTARD's CenteredClip clips every peer's contribution to a radius around the
  centre; here the centre is the island's own anchor): a partner moves the anchor by at most
  `CLIP x D`, its weight `a` becoming `min(a, CLIP x D / |phi_j - phi_i|)`, the distance less what
  the state's encoding rounded off (`codecs.rounding_error`: int8 rounds a 124M state by about 0.5%
  of its norm, far more than a round of warmup moves it).
- **Momentum**: refused when its norm exceeds `MOMENTUM_RATIO x D / (1 - mu)`; an honest momentum
  sums pseudo-gradients decaying by mu, so its norm stays under `D / (1 - mu)`.
- **Momentum, learned**: whatever passes that is scaled down to at most `MOMENTUM_CLIP` times the
  island's own momentum's norm (the median of its last `HISTORY` outer steps, or the last if
  larger): honest partners' momenta blend with one another every round, so their norms sit within
  a few tens of percent of the island's own, while one x3 passed the bound above and, blended at
  0.5 and rescaled (`core.modes`), doubled the island's momentum at every mix it got (+1.8%,
  BENCHMARKS.md "The quiet members"). The island's own momentum is itself mixed, so a partner at
  the bound every time lifts it by `(1 + a (MOMENTUM_CLIP - 1))` per mix, against the decay by `mu`
  at each outer step; the bound above stays the ceiling.
- **Size**: a state whose anchor's norm differs from the island's own by more than `SIZE_ROUNDS x D`,
  plus a round for each version the two states are apart, is refused: an honest partner's weights
  grow or shrink as the island's own do, a round's progress apart at most at one version (an island
  resumed behind the swarm is as many rounds from it as it is versions), while a scaled state (x1.5)
  can sit closer than honest partners do early on, when the weights move fast.
- **Behind**: a state that sits more than `BEHIND_ROUNDS` of the island's own rounds back along the
  direction it progresses in (its momentum), beyond the versions the state's own version lags, is
  refused: stuck training, a restored old checkpoint or a reversed change passes a distance gate,
  but not this.
- **Start**: until the gate has learned distances, a state farther than `START_ROUNDS x D` is refused
  (a fixed relative bound of 1.0 let an anchor x1.5 through).
- **Apart**: an island that mixed nothing for more than `APART_AFTER` of its rounds widens the size,
  behind and distance bounds by `sqrt(2 n)` rounds for the `n` rounds past that (two islands that
  train apart drift like two walks of a round's progress a step), at most `APART_MOST`: two honest
  islands whose first rounds went unmixed (a fetch that timed out, a partner refused early on)
  measured 11 and 37 of their rounds apart some 110 rounds later, in two runs of the suite's test,
  and refused each other for the rest of the run (farther than the widening reaches, the island
  behind catches up: `peers.state.source.CatchingUp`). Each mix
  halves the count (a mix moves the anchor by at most `CLIP x D`, so two islands that were far apart
  need a few to come together) and adopting a state ends it; an island that mixes every round keeps
  the bounds as they are. What a hostile member gains by it: the few clipped mixes of an island that
  had no partner's state for that long.

Before the island's first outer step, `D` is the pseudo-gradient of the round so far, scaled to a
whole round (`core.island.OuterLoop.progress`); after it joined by adopting a state whole, it is
read from the momentum it took until its own rounds replace it (`adopted`). BENCHMARKS.md ("A hostile member") measures what
each bound buys. The constants named here are `p2p_diloco.admission.BoundsSettings`'s fields.
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
        self.unmixed = 0
        """The island's own rounds without a mix, halved by each mix and ended by an adopted state (`mixed`)."""

    def own_round(self, delta_norm: float, advance: float | None = None, momentum_norm: float | None = None) -> None:
        """One outer step: its pseudo-gradient's norm, its advance along the momentum, the momentum's norm after it."""
        if math.isfinite(delta_norm) and delta_norm > 0:
            self.deltas.append(delta_norm)
        if momentum_norm is not None and math.isfinite(momentum_norm) and momentum_norm > 0:
            self.momenta.append(momentum_norm)
        if advance is not None and math.isfinite(advance) and advance > 0:
            self.advances.append(advance)
        self.unmixed += 1

    def mixed(self, adopted: bool = False) -> None:
        """A partner's state was mixed (the rounds unmixed halve), or one `adopted` (they end)."""
        self.unmixed = 0 if adopted else self.unmixed // 2

    def apart_rounds(self) -> float:
        """Rounds of the island's own progress its bounds widen by for the rounds it mixed nothing
        (see the module docstring; 0 while it mixes)."""
        n = self.unmixed - self.s.apart_after
        return 0.0 if n <= 0 else min(self.s.apart_most, math.sqrt(2 * n))

    def _apart(self) -> str:
        apart = self.apart_rounds()
        return "" if not apart else f", {apart:.1f} of it for {self.unmixed} rounds unmixed"

    def adopted(self, momentum_norm: float) -> None:
        """The island joined a running swarm by taking a state whole: until its own rounds are remembered, a
        round's progress is read from the momentum it took, `|m| sqrt(1 - mu^2)` (exact for rounds of
        one size in unrelated directions; rounds that agree sum to more, so this reads a round as up
        to 4.4x what it was at mu 0.9), not from its first rounds after it, which its inner optimizer's
        warmup keeps small: so a joiner does not refuse the swarm it joined. The bounds are that much
        looser for the few rounds its own progress takes to outweigh it in the median; no partner
        state moves it otherwise, and the state adopted is the one most members agree on."""
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

    def size(self, norm: float, own_norm: float, d: float | None, lag: int) -> str | None:
        """Why a state whose anchor has norm `norm`, `lag` versions from the island's (either way), is
        refused, against the island's own `own_norm` (None: it is not)."""
        bound = self.s.size_rounds + abs(lag) + self.apart_rounds()
        if d is None or abs(norm - own_norm) <= bound * d:
            return None
        return (f"implausible size: its weights' norm is {norm / max(own_norm, 1e-12):.3g} x this island's, "
                f"{abs(norm - own_norm) / d:.1f} of its rounds of progress apart at {abs(lag)} versions' lag "
                f"(bound {bound:.3g}{self._apart()})")

    def rounds_behind(self, along: float | None) -> float | None:
        """How many of the island's own rounds a state sits back along its progress (None: unknown)."""
        return None if along is None or not self.advances else along / statistics.median(self.advances)

    def behind(self, along: float | None, lag: int) -> str | None:
        """Why a state `along` back along the island's progress (anchor units), `lag` versions behind,
        is refused (None: it is not)."""
        rounds, more = self.rounds_behind(along), self.s.behind_rounds + self.apart_rounds()
        if rounds is None or rounds <= max(0, lag) + more:
            return None
        return (f"behind: {rounds:.1f} of this island's rounds back along its progress at {max(0, lag)} "
                f"versions' lag (bound {more:.3g} more{self._apart()}): stuck, old or reversed training")

    def start_bound(self, d: float | None, anchor_norm: float | None, noise: float = 0.0) -> float | None:
        """The gate's relative bound before it learned distances (None: nothing to learn it from);
        `noise`: what the state's encoding rounded off, which adds to any distance."""
        if d is None or not anchor_norm:
            return None
        return math.hypot((self.s.start_rounds + self.apart_rounds()) * d, noise) / anchor_norm

    def apart_distance(self, d: float | None, anchor_norm: float | None) -> float:
        """What the gate's learned relative bound widens by (`apart_rounds` of progress `d`)."""
        return 0.0 if d is None or not anchor_norm else self.apart_rounds() * d / anchor_norm
