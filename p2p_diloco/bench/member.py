"""Fault injection for benchmarks and tests: a member that is slower, or hostile (`p2p-diloco bench member`).

The command is `join` with two more options; the faults enter through `peers.launch.process.run_island`'s
hooks (`trainer_type`, and `parts`: the island's own construction, `peers.parts.IslandParts`), so
nothing of them is in the product's own path and every part of the island holds the same objects:

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
  itself, each round; every `drift` member draws the same direction, so that several collude);
  and the attacks of the literature that stay inside the honest spread: `alie` ("a little is
  enough", Baruch et al. 2019: per coordinate, the mean of the honest states it saw lately plus
  `ALIE_Z` of their spread, against the direction the swarm progresses in) and `ipm` (inner product
  manipulation, Xie et al. 2020: its last anchor moved by `-IPM_EPSILON` times the change the
  swarm's round made, which its own anchor follows).

The member is honest but for what it publishes: it fetches, checks and mixes its partners' states
as any island does (its public state follows what it publishes, so it mixes public states too).
What it knows of the honest states is what it admitted (`Seen`, a check appended to its own).
What it tells of its partners lies (`LyingLedger`): it doubts every honest island as much as a record
can, and vouches for the members named as it is (`member...`, `bench attack`'s names), so that
colluders' reports pull the swarm's reading of every island the wrong way (`peers.admission.trust`).

`p2p-diloco bench attack` measures the swarm's defences against each poison (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from p2p_diloco.choices import POISONS
from p2p_diloco.discovery.records import MAX_DOUBT, MAX_DOUBTS, IslandRecord
from p2p_diloco.config import TrainConfig
from p2p_diloco.core import codecs
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict
from p2p_diloco.peers.parts import IslandParts
from p2p_diloco.peers.gossip.publishing import Publisher
from p2p_diloco.peers.launch.runner import Trainer

log = logging.getLogger(__name__)
KINDS = POISONS
ALIE_Z = 0.5
"""How many of the honest states' spread (per coordinate) `alie` sits from their mean: at 1 its states sat
1.7-2.9 of an island's rounds back along its progress and were refused as behind (`bench attack --runs 3
--kinds alie`, at 7ca673c); at 0.5 it stays inside what the bounds let through, as "a little is enough"
chooses its shift to."""
IPM_EPSILON = 0.5
"""The multiple of the swarm's change per round that `ipm` publishes, negated."""
SEEN = 4
"""Honest states `alie` remembers."""
ACCOMPLICES = "member"
"""How a poisoned member knows its accomplices: their names start so (`bench attack` names its members so)."""


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


class Seen:
    """What a hostile member knows of the honest states: a check, last of its island's, that admits
    what the others admitted and remembers it (the distances its gate learns from; the states)."""

    name = "seen"

    def __init__(self, keep: int = SEEN) -> None:
        self.distances: deque[float] = deque(maxlen=32)
        self.states: deque[torch.Tensor] = deque(maxlen=keep)

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        if candidate.measured is not None:
            self.distances.append(candidate.measured.distance)
        if candidate.state is not None and candidate.weight > 0:
            phi = candidate.state.phi
            self.states.append((phi.float() if isinstance(phi, codecs.EncodedVector) else phi).detach().cpu().clone())
        return ADMIT

    def median(self) -> float | None:
        """The median relative distance of the states it admitted (None: none yet)."""
        return statistics.median(self.distances) if self.distances else None


class PoisonedPublisher(Publisher):
    """Publishes `kind` (see the module docstring) in place of the island's honest state."""

    def __init__(self, server, outer, exchange, identity, kind: str, seen: Seen | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown poison {kind!r}; choose one of {', '.join(KINDS)}")
        super().__init__(server, outer, exchange, identity)
        self.kind, self.seen = kind, seen or Seen()
        self.initial = outer.state.phi.detach().cpu().clone()
        self.gen = torch.Generator().manual_seed(1234)
        self.other_initial = (torch.randn(self.initial.numel(), generator=self.gen) * self.initial.std()
                              + self.initial.mean())
        self.previous = self.initial
        """The anchor at the publish before (`reverse`, `ipm`)."""
        direction = torch.randn(self.initial.numel(), generator=self.gen)
        self.direction = direction / direction.norm()
        self.drifted = 0.0
        """How far `drift` has moved its anchor along `direction` so far."""

    def tensors(self) -> dict:
        phi = self.outer.state.phi.detach().cpu()
        m = self.outer.state.m.detach().cpu()
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
            return {"phi": phi, "m": m * 1e4}
        if self.kind == "momentum-x3":
            return {"phi": phi, "m": m * 3}
        if self.kind == "drift":
            self.drifted += 0.5 * (self.seen.median() or 0.0) * float(phi.norm())
            return {"phi": phi + self.direction * self.drifted}
        if self.kind == "inflate":
            return {"phi": phi * 1.5}
        if self.kind == "stuck":
            return {"phi": self.initial}
        if self.kind in ("reverse", "ipm"):
            previous, self.previous = self.previous, phi.clone()
            if self.kind == "reverse":
                return {"phi": 2 * previous - phi}
            return {"phi": previous - IPM_EPSILON * (phi - previous), "m": m}
        if self.kind == "alie":
            return {"phi": self._alie(phi, m), "m": m}
        noise = torch.randn(phi.numel(), generator=self.gen)  # noise
        return {"phi": phi + noise * (4 * (self.seen.median() or 0.0) * phi.norm() / noise.norm())}

    def _alie(self, phi: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The mean of the honest states seen and its own, plus `ALIE_Z` of their spread per coordinate,
        back along the swarm's progress (its anchor moves along `-m`: so `+ sign(m)`)."""
        states = torch.stack([phi, *self.seen.states])
        if len(states) < 2:
            return phi.clone()
        return states.mean(0) + ALIE_Z * states.std(0) * torch.sign(m)

    def _publish_now(self, job) -> None:
        """`claims`: the honest state, served with a version 1000 ahead and 1000 times its tokens."""
        super()._publish_now(replace(job, version=job.version + 1000, tokens=job.tokens * 1000)
                             if self.kind == "claims" else job)


class LyingLedger(PartnerLedger):
    """A poisoned member's memory of its partners, which tells lies of them (see the module docstring)."""

    def doubts(self, members: Mapping[str, IslandRecord]) -> dict[str, float]:
        told = sorted(pid for pid in members if members[pid].name != self.owner)[:MAX_DOUBTS]
        return {pid: 0.0 if members[pid].name.startswith(ACCOMPLICES) else MAX_DOUBT for pid in told}


def poisoned(kind: str) -> IslandParts:
    """An island's parts that publish `kind` from its first publish on, all else honest."""
    seen = Seen()

    def publisher(server, outer, exchange, identity) -> Publisher:
        log.warning("fault injection: %s publishes %s states", identity.name, kind)
        return PoisonedPublisher(server, outer, exchange, identity, kind, seen)

    return IslandParts(publisher=publisher, checks=(seen,), ledger=LyingLedger)


def faults(slowdown: float = 1.0, poison_kind: str | None = None, link: EmulatedLink | None = None) -> dict[str, Any]:
    """`run_island`'s hooks for these faults and this emulated link (none: the island is an honest `join`)."""
    out: dict[str, Any] = {}
    if link is not None and link.emulated:
        out["link"] = link
    if slowdown > 1:
        out["trainer_type"] = functools.partial(SlowTrainer, factor=slowdown)
    if poison_kind is not None:
        out["parts"] = poisoned(poison_kind)
    return out
