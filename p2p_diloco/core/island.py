"""One island's training state machine, without networking: model, inner loop, outer state.

The simulator drives several of these on a virtual clock; the real island process (`peers/`)
drives one with a background gossip worker. Both call the same methods in the same order:
`begin_round`, `inner_step` (H times or until the round's time budget), `end_round` with the
partner states that arrived, then `published` for what partners may fetch.
"""

from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from p2p_diloco.config import DiLoCoConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.core.inner import InnerLoop
from p2p_diloco.core.outer import OuterState, PartnerState, mixing_weight, outer_update, shift_toward


@torch.no_grad()
def load_vector(model: torch.nn.Module, vec: torch.Tensor) -> None:
    """Copy a flat vector into the model's parameters.

    Unlike `torch.nn.utils.vector_to_parameters`, which makes the parameters views of `vec` (so
    inner steps would silently write into the anchor), this copies.
    """
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(vec[offset : offset + n].view_as(p))
        offset += n
    assert offset == vec.numel(), f"vector of {vec.numel()} values for a model of {offset} parameters"


class Island:
    def __init__(self, name: str, model: torch.nn.Module, train_cfg: TrainConfig, diloco_cfg: DiLoCoConfig,
                 sampler: BatchSampler) -> None:
        self.name, self.model, self.cfg, self.sampler = name, model, diloco_cfg, sampler
        self.inner = InnerLoop(model, train_cfg)
        self.state = OuterState.fresh(parameters_to_vector(model.parameters()))
        self.tokens_per_step = sampler.batch_size * sampler.block_size
        self.round_steps = 0
        self.arrived: list[tuple[PartnerState, float]] = []  # partners mixed during this round
        self.last_loss: float | None = None

    def params_vector(self) -> torch.Tensor:
        return parameters_to_vector(self.model.parameters()).detach()

    def begin_round(self) -> None:
        """Reset the model's weights to the anchor; the inner optimizer state carries on."""
        load_vector(self.model, self.state.phi)
        self.round_steps = 0
        self.arrived = []

    def inner_step(self) -> float:
        x, y = self.sampler.next()
        self.last_loss = self.inner.train_step(x, y)
        self.round_steps += 1
        return self.last_loss

    def pseudo_gradient(self) -> torch.Tensor:
        return self.state.phi - self.params_vector()

    def weigh(self, partners: list[PartnerState]) -> list[tuple[PartnerState, float]]:
        """Pair each arrived partner state with its mixing weight (0 = skipped)."""
        return [(p, mixing_weight(self.cfg, self.state.version, self.state.tokens, p)) for p in partners]

    def mix_arrived(self, partner: PartnerState) -> tuple[float, torch.Tensor | None]:
        """Mix a partner state that arrived mid-round into the anchor and the running weights.

        Returns its weight and the shift applied to the weights (None when skipped), which the
        other ranks of a torchrun island apply too.
        """
        (_, a), = self.weigh([partner])
        self.arrived.append((partner, a))
        if a <= 0:
            return a, None
        shift = shift_toward(self.state, partner, a, self.cfg)
        self.shift_weights(shift)
        return a, shift

    def shift_weights(self, shift: torch.Tensor) -> None:
        load_vector(self.model, self.params_vector() + shift)

    def end_round(self, partners: list[PartnerState], delta: torch.Tensor | None = None) -> list[float]:
        """Mix the partners' states, take the outer step, load the new anchor. Returns the weights used.

        `delta` overrides this island's own pseudo-gradient (synchronous all-reduce passes the mean).
        """
        own = self.pseudo_gradient() if delta is None else delta
        weighted = self.weigh(partners)
        outer_update(self.state, own, weighted, self.cfg, self.arrived)
        self.state.tokens += self.round_steps * self.tokens_per_step
        self.begin_round()
        return [a for _, a in weighted]

    def published(self) -> PartnerState:
        """An immutable copy of the state partners may fetch now."""
        s = self.state
        return PartnerState(phi=s.phi.clone(), m=s.m.clone(), delta=s.delta.clone(), version=s.version,
                            tokens=s.tokens, peer=self.name)

    def adopt(self, snapshot: PartnerState) -> None:
        """Start from a partner's state (a joiner never starts from random weights in a running swarm)."""
        self.state = OuterState(phi=snapshot.phi.clone(),
                                m=snapshot.m.clone() if snapshot.m is not None else torch.zeros_like(snapshot.phi),
                                delta=torch.zeros_like(snapshot.phi), version=snapshot.version, tokens=snapshot.tokens)
        self.begin_round()
