"""Fault injection for benchmarks and tests: a member that is slower, or hostile (`p2p-diloco bench member`).

The command is `join` with two more options; the faults enter through `peers.process.run_island`'s
two hooks (`trainer_type`, `on_island`), so nothing of them is in the product's own path:

- `--slowdown X`: after each inner step the island idles (X - 1) times the step's duration, as a
  slower machine would (`SlowTrainer`);
- `--poison KIND`: the island trains honestly but publishes a poisoned state instead of its own
  (`PoisonedPublisher`), holding the swarm secret and a valid record, like a member gone bad:
  `nan` (its anchor with NaN values, sent as NaN scales of its int8 blocks, as an implementation
  without a finiteness check would), `scale` (its anchor times 1e6), `random` (random values of
  its anchor's scale), `other-run` (the same training on top of other initial weights), and five
  that pass a distance gate: `momentum` (its anchor, with its outer momentum x1e4), `inflate` (its
  anchor x1.5), `stuck` (its initial weights every round, as a member whose training is stuck),
  `reverse` (its last round's change reversed), `noise` (its anchor plus noise at 4x the median
  distance of the states it accepts itself); and three quiet ones: `claims` (its honest state,
  claiming version +1000 and tokens x1000), `momentum-x3` (its anchor, with its outer momentum x3),
  `drift` (its anchor plus a fixed direction that grows by half the median distance it accepts
  itself, each round).

`p2p-diloco bench attack` measures the swarm's defences against each poison (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from typing import Any

import torch

from p2p_diloco.choices import POISONS
from p2p_diloco.config import TrainConfig
from p2p_diloco.core import codecs
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.peers.island import SwarmIsland
from p2p_diloco.peers.publishing import Publisher
from p2p_diloco.peers.runner import Trainer

log = logging.getLogger(__name__)
KINDS = POISONS


class SlowTrainer(Trainer):
    """The project's inner loop, `factor` times slower: each step is followed by an idle wait."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, factor: float = 1.0) -> None:
        super().__init__(model, cfg)
        self.factor = factor

    def step(self) -> float:
        started = time.monotonic()
        loss = super().step()
        time.sleep((self.factor - 1) * (time.monotonic() - started))
        return loss


class PoisonedPublisher(Publisher):
    """Publishes `kind` (see the module docstring) in place of the island's honest state."""

    def __init__(self, honest: Publisher, kind: str, accepted=lambda: None) -> None:
        """`accepted()`: the median relative distance of the states this island accepted (None: none yet)."""
        if kind not in KINDS:
            raise ValueError(f"unknown poison {kind!r}; choose one of {', '.join(KINDS)}")
        super().__init__(honest.server, honest.outer, honest.exchange, honest.identity)
        self.kind = kind
        self.initial = honest.outer.state.phi.clone()
        self.gen = torch.Generator().manual_seed(1234)
        self.other_initial = (torch.randn(self.initial.numel(), generator=self.gen) * self.initial.std()
                              + self.initial.mean())
        self.accepted = accepted
        self.previous = self.initial
        """The anchor at the publish before (`reverse`)."""
        direction = torch.randn(self.initial.numel(), generator=self.gen)
        self.direction = direction / direction.norm()
        self.drifted = 0.0
        """How far `drift` has moved its anchor along `direction` so far."""

    def tensors(self) -> dict:
        phi = self.outer.state.phi.detach().cpu()
        if self.kind == "nan":  # encoded by hand: the server's own publish check would refuse NaN values
            enc = codecs.encode(phi, "int8").clone()
            enc[: 4 * 16].view(torch.float32)[:] = float("nan")  # the scales of the first 16 blocks
            return {"phi": codecs.EncodedVector(enc, "int8", phi.numel())}
        if self.kind == "scale":
            return {"phi": phi * 1e6}
        if self.kind == "random":
            return {"phi": torch.randn(phi.numel(), generator=self.gen) * phi.std()}
        if self.kind == "other-run":
            return {"phi": phi - self.initial + self.other_initial}
        if self.kind == "momentum":
            return {"phi": phi, "m": self.outer.state.m.detach().cpu() * 1e4}
        if self.kind == "momentum-x3":
            return {"phi": phi, "m": self.outer.state.m.detach().cpu() * 3}
        if self.kind == "drift":
            self.drifted += 0.5 * (self.accepted() or 0.0) * float(phi.norm())
            return {"phi": phi + self.direction * self.drifted}
        if self.kind == "inflate":
            return {"phi": phi * 1.5}
        if self.kind == "stuck":
            return {"phi": self.initial}
        if self.kind == "reverse":
            previous, self.previous = self.previous, phi.clone()
            return {"phi": 2 * previous - phi}
        noise = torch.randn(phi.numel(), generator=self.gen)  # noise
        return {"phi": phi + noise * (4 * (self.accepted() or 0.0) * phi.norm() / noise.norm())}

    def _publish_now(self, job) -> None:
        """`claims`: the honest state, served with a version 1000 ahead and 1000 times its tokens."""
        super()._publish_now(replace(job, version=job.version + 1000, tokens=job.tokens * 1000)
                             if self.kind == "claims" else job)

    def _advance_public(self, anchor: torch.Tensor | codecs.EncodedVector, parts: int, chain: int, version: int,
                        tokens: int) -> None:
        """The public state (`--exchange auto` or `updates`) follows what is published, poison and all (the
        `nan` kind's NaN scales make the public state and its updates NaN there too)."""
        anchor = anchor.float() if isinstance(anchor, codecs.EncodedVector) else anchor
        super()._advance_public(anchor, parts, chain, version, tokens)


def poison(island: SwarmIsland, kind: str) -> None:
    """Make `island` publish `kind` from its first publish on."""
    island.publisher = PoisonedPublisher(island.publisher, kind, lambda: island.checks.gate.median())
    log.warning("fault injection: %s publishes %s states", island.name, kind)


def faults(slowdown: float = 1.0, poison_kind: str | None = None, link: EmulatedLink | None = None) -> dict[str, Any]:
    """`run_island`'s hooks for these faults and this emulated link (none: the island is an honest `join`)."""
    out: dict[str, Any] = {}
    if link is not None and link.emulated:
        out["link"] = link
    if slowdown > 1:
        out["trainer_type"] = functools.partial(SlowTrainer, factor=slowdown)
    if poison_kind is not None:
        out["on_island"] = functools.partial(poison, kind=poison_kind)
    return out
