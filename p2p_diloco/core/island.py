"""One island's training state machine, without networking: outer state over any model, plus the
project's own inner loop.

`OuterLoop` holds an island's outer state (anchor, momentum) for any `torch.nn.Module`: it resets
the weights to the anchor, mixes a partner's state into anchor and weights, and takes the outer
step. It never runs the model, so a user's own training loop drives it (`p2p_diloco.peers.island`).
`Island` adds the project's own inner loop (AdamW on its own batches) for the simulator.

Both are driven in the same order: `begin_round`, inner steps (H of them or until the round's time
budget), `mix_arrived` for a partner state that arrives between two of them, `end_round` with the
partner states that arrived after the last one.

The anchor and momentum live on the model's device, or on the host with `offload_outer`; every
operation walks the parameters slice by slice (`p2p_diloco.core.params`), so no temporary grows
with the model beyond a few MiB.
"""

from __future__ import annotations

import math

import torch

from p2p_diloco.admission import BoundsSettings
from p2p_diloco.config import DiLoCoConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.core.influence import InfluenceBound
from p2p_diloco.core.inner import InnerLoop
from p2p_diloco.core.modes import momentum_mode
from p2p_diloco.core.outer import OuterState, PartnerState, mix, mix_counters_, mix_slice_, mixing_weight, nesterov_
from p2p_diloco.core.params import CHUNK, ParamSlices


class OuterLoop:
    """The outer state of one island over a model's trainable parameters (see the module docstring)."""

    def __init__(self, name: str, model: torch.nn.Module, cfg: DiLoCoConfig, bounds: BoundsSettings | None = None) -> None:
        """`bounds`: the settings of the bounds learned from the island's own rounds (`core.influence`)."""
        self.name, self.model, self.cfg = name, model, cfg
        self.momentum = momentum_mode(cfg.momentum)
        self.slices = ParamSlices(model)
        outer_device = torch.device("cpu") if cfg.offload_outer else self.slices.device
        self.state = OuterState.fresh(self.slices.gather(outer_device))
        self.influence = InfluenceBound(cfg.outer_momentum, bounds)
        self.round_steps = 0
        self.last_loss: float | None = None

    def params_vector(self) -> torch.Tensor:
        """A copy of the running weights as one flat fp32 vector, where the anchor lives."""
        return self.slices.gather(self.state.phi.device)

    def begin_round(self) -> None:
        """Reset the model's weights to the anchor; the inner optimizer state carries on."""
        self.slices.load(self.state.phi)
        self.round_steps = 0

    def pseudo_gradient(self) -> torch.Tensor:
        return self.state.phi - self.params_vector()

    def weight(self, partner: PartnerState) -> float:
        """The mixing weight of a partner's state now (0 = skip it; `core.outer.mixing_weight`), at most
        the weight its admission decided (`PartnerState.cap`)."""
        return max(0.0, min(mixing_weight(self.cfg, self.state.version, self.state.tokens, partner), partner.cap))

    @torch.no_grad()
    def progress(self) -> float | None:
        """`D` of `core.influence`: the norm of the island's own pseudo-gradient over a round (before its
        first outer step, the round's so far, scaled to a whole round; None before its first step)."""
        d = self.influence.reference()
        if d is not None or self.round_steps == 0:
            return d
        total = sum(float((self.state.phi[i:j] - theta.to(self.state.phi.device, torch.float32)).double().square().sum())
                    for i, j, theta in self.slices)
        return math.sqrt(total) * max(1.0, self.cfg.local_steps / self.round_steps)

    def weigh(self, partners: list[PartnerState]) -> list[tuple[PartnerState, float]]:
        """Pair each arrived partner state with its mixing weight (0 = skipped)."""
        return [(p, self.weight(p)) for p in partners]

    @torch.no_grad()
    def mix(self, partner: PartnerState) -> float:
        """Mix a partner's state into the anchor alone (the running weights are left as they are).
        Returns the weight used (0: skipped)."""
        a = self.weight(partner)
        mix(self.state, partner, a, self.cfg, self.momentum, [(i, j) for i, j, _ in self.slices])
        return a

    @torch.no_grad()
    def mix_arrived(self, partner: PartnerState) -> float:
        """Mix a partner state that arrived mid-round into the anchor and the running weights.

        The weights move by the anchor's shift `a (phi_j - phi_i)`, so the pseudo-gradient
        `phi - theta` still holds only this island's own progress and the rest of the round trains
        from the mixed point. Returns the weight used (0: skipped).
        """
        a = self.weight(partner)
        if a <= 0:
            return a
        s = self.state
        for i, j, theta in self.slices:  # each slice of the partner's state decoded once
            theirs = partner.phi[i:j].to(s.phi.device, non_blocking=True)
            shift = (theirs - s.phi[i:j]).mul_(a)
            theta.add_(shift.to(theta.device, theta.dtype, non_blocking=True))
            mix_slice_(s, partner, a, self.momentum, i, j, theirs)
        mix_counters_(s, partner, a, self.cfg)
        return a

    @torch.no_grad()
    def shift_running(self, partner: PartnerState, a: float) -> None:
        """Move the running weights alone by `a (phi_j - phi_i)` (a negative `a` takes the move back, up
        to the weights' rounding): what a mix on arrival does to them (`peers.admission.probe`)."""
        s = self.state
        for i, j, theta in self.slices:
            shift = (partner.phi[i:j].to(s.phi.device, non_blocking=True) - s.phi[i:j]).mul_(a)
            theta.add_(shift.to(theta.device, theta.dtype, non_blocking=True))

    @torch.no_grad()
    def end_round(self, partners: list[PartnerState], delta: torch.Tensor | None = None,
                  tokens: int = 0) -> list[float]:
        """Mix the partners' states into the anchor, take the outer step, load the new anchor.
        Returns the weights used.

        The partners' states were published one round earlier than this round's pseudo-gradient was
        computed: they are contemporaneous with the anchor *before* this round's step, so they are
        mixed into that anchor first and the island's own step follows, never pulling the fresh
        step back toward an old state. `delta` overrides the island's own pseudo-gradient
        (synchronous all-reduce passes the mean); `tokens` are those the round trained on. The step
        runs slice by slice and never holds the whole pseudo-gradient.
        """
        weighted = self.weigh(partners)
        s, lr, mu = self.state, self.cfg.outer_lr, self.cfg.outer_momentum
        sums = torch.zeros(3, dtype=torch.float64, device=s.phi.device)  # |delta|^2, <step, m>, |m|^2
        for i, j, theta in self.slices:
            own = s.phi[i:j] - theta.to(s.phi.device, torch.float32, non_blocking=True) if delta is None else delta[i:j]
            for partner, a in weighted:
                if a > 0:
                    mix_slice_(s, partner, a, self.momentum, i, j)
            sums[0] += torch.dot(own, own)
            step = nesterov_(s.phi[i:j], s.m[i:j], own, lr, mu)
            sums[1] += torch.dot(step, s.m[i:j])
            sums[2] += torch.dot(s.m[i:j], s.m[i:j])
        own_sq, along, m_sq = sums.tolist()
        self.influence.own_round(math.sqrt(own_sq), lr * along / math.sqrt(m_sq) if m_sq > 0 else None, math.sqrt(m_sq))
        for partner, a in weighted:
            if a > 0:
                mix_counters_(s, partner, a, self.cfg)
        s.version += 1
        s.tokens += tokens
        self.begin_round()
        return [a for _, a in weighted]

    @torch.no_grad()
    def adopt(self, snapshot: PartnerState, joined: bool = False) -> None:
        """Start from a partner's state (a joiner never starts from random weights in a running swarm;
        `joined`: it had not trained, so its bounds take the adopted momentum's scale,
        `InfluenceBound.adopted`).

        Written into the island's own vectors a slice at a time, so a state that arrived encoded is
        never decoded whole.
        """
        s = self.state
        for i in range(0, s.phi.numel(), CHUNK):
            j = min(i + CHUNK, s.phi.numel())
            s.phi[i:j].copy_(snapshot.phi[i:j].to(s.phi.device, non_blocking=True))
            if snapshot.m is None:
                s.m[i:j].zero_()
            else:
                s.m[i:j].copy_(snapshot.m[i:j].to(s.m.device, non_blocking=True))
        s.version, s.tokens = snapshot.version, snapshot.tokens
        if joined:
            self.influence.adopted(float(s.m.norm()))
        self.begin_round()


class Island(OuterLoop):
    """An `OuterLoop` that trains with the project's own inner loop on its own batches (the simulator)."""

    def __init__(self, name: str, model: torch.nn.Module, train_cfg: TrainConfig, diloco_cfg: DiLoCoConfig,
                 sampler: BatchSampler) -> None:
        super().__init__(name, model, diloco_cfg)
        self.sampler = sampler
        self.inner = InnerLoop(model, train_cfg)
        self.tokens_per_step = sampler.batch_size * sampler.block_size

    def inner_step(self) -> float:
        x, y = self.sampler.next()
        self.last_loss = self.inner.train_step(x, y)
        self.round_steps += 1
        return self.last_loss

    def end_round(self, partners: list[PartnerState], delta: torch.Tensor | None = None,
                  tokens: int | None = None) -> list[float]:
        return super().end_round(partners, delta, self.round_steps * self.tokens_per_step if tokens is None else tokens)


@torch.no_grad()
def load_vector(model: torch.nn.Module, vec: torch.Tensor) -> None:
    """Copy a flat vector into the model's trainable parameters (they never alias it)."""
    ParamSlices(model).load(vec)
