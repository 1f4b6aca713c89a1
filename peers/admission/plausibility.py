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

The distance is computed on the gossip worker's thread as the state arrives (`measure`), so a
refused state costs the training loop nothing; a refused partner backs off and, refused again and
again, is never chosen again (`PartnerChooser.refused`). The constants named here are
`p2p_diloco.admission.GateSettings`' fields (`START_ROUNDS`: `BoundsSettings.start_rounds`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch

from p2p_diloco.admission import GateSettings
from p2p_diloco.core.codecs import EncodedVector, rounding_error
from p2p_diloco.core.params import CHUNK
from p2p_diloco.peers.admission.drift import SKETCHER, Sketcher
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict

def _slice(x, i: int, device: torch.device | None = None) -> torch.Tensor:
    part = x[i : i + CHUNK]
    part = part if isinstance(part, torch.Tensor) else part.float()  # an EncodedVector decodes its slice
    return part if device is None else part.to(device, non_blocking=True)


@torch.no_grad()
def distance(x, y) -> float:
    """`|x - y|`, slice by slice (either may be an `EncodedVector` on the host)."""
    total = 0.0
    for i in range(0, x.numel(), CHUNK):
        a = _slice(x, i)
        total += float((_slice(y, i, a.device) - a).double().square().sum())
    return math.sqrt(total)


@torch.no_grad()
def norm(x) -> float:
    return math.sqrt(sum(float(_slice(x, i).double().square().sum()) for i in range(0, x.numel(), CHUNK)))


def relative_distance(own, theirs) -> float:
    """`|theirs - own| / |own|`."""
    return distance(own, theirs) / max(norm(own), 1e-12)


@dataclass(frozen=True)
class Measured:
    """What a partner's state measured against this island's own, on the thread it arrived on."""

    distance: float
    """`|phi_j - phi_i| / |phi_i|`: what the gate judges (public states: their whole difference)."""
    gap: float
    """`|phi_j - phi_i|`: what bounds the mix's weight (`core.influence`; public states: the share of
    their difference a mix takes)."""
    anchor_norm: float
    """`|phi_i|`."""
    norm: float
    """`|phi_j|`."""
    along: float | None = None
    """How far `phi_j` sits back along this island's progress, `<phi_j - phi_i, m_i> / |m_i|` (None:
    no momentum yet)."""
    momentum: float | None = None
    """`|m_j|`, when the state holds a momentum."""
    noise: float = 0.0
    """What its encoding took from `phi_j` (`codecs.rounding_error`): part of `gap` that no training made."""
    move: torch.Tensor | None = None
    """A sketch (`peers.admission.drift`) of what a mix with weight 1 moves the anchor by, less its part along this
    island's momentum (None: not sketched)."""

    @property
    def trained(self) -> float:
        """`gap` less the encoding's rounding (the two are all but orthogonal)."""
        return math.sqrt(max(0.0, self.gap ** 2 - self.noise ** 2))


@torch.no_grad()
def measure(own, theirs, own_m=None, their_m=None, base=None, share: float = 1.0,
            sketch: Sketcher = SKETCHER) -> Measured:
    """Measure `theirs` against the anchor `own` (and its momentum `own_m`) in one pass, slice by
    slice; `base`: what `theirs` is taken from instead of `own` (public states: the partner's and
    this island's own, whose difference is what a mix adds to the anchor, `share` of it where updates
    come in fragments: `core.public.mixed_share`). The gate's `distance` is of the whole difference,
    as every distance it learned; the rest is of what the mix moves, the share, sketched for the
    island's memory of each partner's mixes (`peers.admission.drift`) with `sketch`."""
    gap = own_sq = their_sq = along = m_sq = 0.0
    move, m_sketch = sketch.empty(), sketch.empty()
    for i in range(0, own.numel(), CHUNK):
        a = _slice(own, i).double()
        d = (_slice(theirs, i, a.device) - _slice(own if base is None else base, i, a.device)).double()
        gap += float(d.square().sum())
        own_sq += float(a.square().sum())
        moved = d.mul_(share)  # what a mix moves the anchor towards
        their_sq += float((a + moved).square().sum())
        sketch.add_(move, moved, i)
        if own_m is not None:
            m = _slice(own_m, i, a.device)
            along += float((moved * m).sum())
            m_sq += float(m.double().square().sum())
            sketch.add_(m_sketch, m, i)
    if m_sq > 0:  # less its part along the island's own progress
        move.sub_(m_sketch, alpha=along / m_sq)
    anchor, whole = math.sqrt(own_sq), math.sqrt(gap)
    return Measured(whole / max(anchor, 1e-12), share * whole, anchor, math.sqrt(their_sq),
                    along / math.sqrt(m_sq) if m_sq > 0 else None, None if their_m is None else norm(their_m),
                    rounding_error(theirs) if isinstance(theirs, EncodedVector) else 0.0, move)


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
