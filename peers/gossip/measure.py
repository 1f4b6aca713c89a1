"""What a partner's state measures against this island's own, in one pass as it arrives.

The gossip worker (`peers.gossip.worker`), the push inbox (`peers.gossip.reach`) and the public
state's fetches (`peers.gossip.publishing`) measure a state on the thread it arrives on, slice by
slice, so that the admission (`peers.admission`) judges figures, not tensors, and a refused state
costs the training loop nothing: its distance from the anchor (relative, for the gate; absolute,
less its encoding's rounding, for the weight's bound), its norm, where it sits along the island's
progress, its momentum's norm, and a count sketch of what a mix moves (`Sketcher`: `SKETCH_SIZE`
numbers per partner whatever the model's size, which keep inner products to about `1 /
sqrt(SKETCH_SIZE)` of the product of the norms; its random signs are drawn afresh by every process,
so no member can aim a direction at what they lose).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from p2p_diloco.core.codecs import EncodedVector, rounding_error
from p2p_diloco.core.params import CHUNK

SKETCH_SIZE = 4096
"""Numbers in a sketch (a power of two that divides `CHUNK`)."""
STRIDE = 7919
"""How far the buckets of one slice of `CHUNK` values are rotated from those of the slice before."""
class Sketcher:
    """Count sketches of flat vectors, a slice of `CHUNK` values at a time: the value at offset `e` of
    slice `s` goes, times a random sign, to bucket `(e + STRIDE s) mod SKETCH_SIZE`."""

    def __init__(self, seed: int | None = None) -> None:
        g = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
        self._signs = {torch.device("cpu"): torch.randint(0, 2, (CHUNK,), generator=g).float().mul_(2).sub_(1)}

    def signs(self, device: torch.device) -> torch.Tensor:
        if device not in self._signs:
            self._signs[device] = self._signs[torch.device("cpu")].to(device)
        return self._signs[device]

    def add_(self, into: torch.Tensor, x: torch.Tensor, start: int) -> None:
        """Add the sketch of the slice `x` of a vector, at offset `start` (a multiple of `CHUNK`), to `into`."""
        n = x.numel()
        part = x.float() * self.signs(x.device)[:n]
        if n % SKETCH_SIZE:
            part = torch.nn.functional.pad(part, (0, SKETCH_SIZE - n % SKETCH_SIZE))
        buckets = part.view(-1, SKETCH_SIZE).sum(0, dtype=torch.float64).cpu()
        into += buckets.roll((start // CHUNK * STRIDE) % SKETCH_SIZE)

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.zeros(SKETCH_SIZE, dtype=torch.float64)


SKETCHER = Sketcher()
"""The process's sketcher (its signs drawn at start-up)."""



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
