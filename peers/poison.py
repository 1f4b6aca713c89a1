"""Fault injection: a hostile member, as a test double (`p2p-diloco join --poison KIND`, hidden).

The island trains honestly but publishes a poisoned state instead of its own, so the swarm's
defences can be measured against real processes (`p2p-diloco bench attack`, BENCHMARKS.md). It
holds the swarm secret and a valid record, like a member gone bad:

- `nan`: its anchor with NaN values (its own finiteness check on publishing is switched off, as a
  hostile implementation would not have one);
- `scale`: its anchor times 1e6;
- `random`: random values of its anchor's scale;
- `other-run`: the same training on top of other initial weights (another run's state).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from p2p_diloco.config import POISONS
from p2p_diloco.core import codecs

log = logging.getLogger(__name__)
KINDS = POISONS


def poison(island: Any, kind: str) -> None:
    """Make `island` (a `SwarmIsland`) publish `kind` instead of its own state from now on."""
    if kind not in KINDS:
        raise ValueError(f"unknown poison {kind!r}; choose one of {', '.join(KINDS)}")
    publisher, honest = island.publisher, island.publisher.tensors
    initial = island.outer.state.phi.clone()
    gen = torch.Generator().manual_seed(1234)
    other_initial = torch.randn(initial.numel(), generator=gen) * initial.std() + initial.mean()
    if kind == "nan":
        codecs.all_finite = lambda x: True  # the double's own publish check, off in this process only

    def poisoned() -> dict[str, torch.Tensor]:
        phi = honest()["phi"]
        if kind == "nan":
            bad = phi.clone()
            bad[::1000] = float("nan")
        elif kind == "scale":
            bad = phi * 1e6
        elif kind == "random":
            bad = torch.randn(phi.numel(), generator=gen) * phi.std()
        else:
            bad = phi - initial + other_initial
        return {"phi": bad}

    publisher.tensors = poisoned
    log.warning("fault injection: %s publishes %s states", island.name, kind)
