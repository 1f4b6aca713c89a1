"""The outer loop's mathematics: mixing weight, mixing with a partner, outer Nesterov step.

Pure functions on flat fp32 tensors, no model and no network, so the simulator and the real
islands share them exactly and the unit tests can check them against hand-computed values. The
arithmetic of a mix is written once, for one slice of the vectors (`mix_slice_`): mixing walks the
vectors in slices of at most `CHUNK` values, so no temporary grows with the model, and a fetched
state still encoded (`codecs.EncodedVector`) decodes one slice at a time.

Notation (docs/DESIGN.md, section 2): `phi` anchor, `m` outer momentum, `delta = phi - theta` the
pseudo-gradient of one round, `a` the partner's mixing weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.core.modes import Momentum, blend_
from p2p_diloco.core.params import CHUNK


@dataclass
class OuterState:
    """An island's outer state: anchor, momentum, version and tokens."""

    phi: torch.Tensor
    m: torch.Tensor
    version: int = 0
    tokens: int = 0

    @classmethod
    def fresh(cls, phi: torch.Tensor) -> "OuterState":
        phi = phi.detach().float().clone()
        return cls(phi=phi, m=torch.zeros_like(phi))

    def clone(self) -> "OuterState":
        return OuterState(self.phi.clone(), self.m.clone(), self.version, self.tokens)


@dataclass(frozen=True)
class PartnerState:
    """A partner's published state as it arrived: fp32 tensors, or `codecs.EncodedVector`s decoded
    to fp32 a slice at a time as they are mixed (the receiver always accumulates in fp32). `m` is
    None when the partner does not publish its momentum."""

    phi: torch.Tensor
    m: torch.Tensor | None
    version: int
    tokens: int
    peer: str = ""
    extra: dict = field(default_factory=dict)
    m_scale: float = 1.0
    """A factor on its momentum, below 1 where its norm exceeds the bound learned from the island's own
    momenta (`peers.admission`)."""
    cap: float = 1.0
    """The most weight it may be mixed with: the weight its admission decided (`peers.admission`; 1: no
    bound, the simulator's honest partners)."""


def nesterov_(phi: torch.Tensor, m: torch.Tensor, delta: torch.Tensor, lr: float, mu: float) -> torch.Tensor:
    """Outer Nesterov step in place: `m <- mu m + delta`, `phi <- phi - lr (delta + mu m)`; returns
    `delta + mu m` (the step, before the learning rate).

    Works on whole vectors or on matching slices of them (an island steps slice by slice).
    """
    m.mul_(mu).add_(delta)
    step = delta + mu * m
    phi.sub_(step, alpha=lr)
    return step


def counted_tokens(cfg: DiLoCoConfig, own_tokens: int, claimed: int) -> int:
    """A partner's claimed tokens as mixing counts them: at least 0, at most `max_token_ratio` times
    our own, so no claim moves its weight or our token count beyond that ratio."""
    return int(min(max(0, claimed), cfg.max_token_ratio * max(0, own_tokens)))


def staleness_discount(cfg: DiLoCoConfig, lag: int) -> float:
    """Factor on the weight of a partner `lag` versions behind: `1 - d x - (1-d) x^2` with
    `x = lag / (max_staleness + 1)` and `d = staleness_decay`, so 1 for a partner at our version
    or ahead, falling smoothly (slope `d` at first) to 0 at `max_staleness + 1` and beyond."""
    if lag <= 0:
        return 1.0
    x = min(1.0, lag / (cfg.max_staleness + 1))
    return max(0.0, 1 - cfg.staleness_decay * x - (1 - cfg.staleness_decay) * x * x)


def mixing_weight(cfg: DiLoCoConfig, own_version: int, own_tokens: int, partner: PartnerState) -> float:
    """Weight `a` of a partner's state; 0 means skip it.

    Token weighting: `a = 2 * mix_weight * t_j / (t_i + t_j)` with the partner's tokens `t_j`
    counted as at most `max_token_ratio` times ours (`counted_tokens`), so equal tokens give
    `mix_weight` and no claim pushes `a` past `2 * mix_weight * r / (1 + r)` (0.75 at the
    defaults); a joiner takes the swarm's state with `OuterLoop.adopt`, not by mixing. Staleness:
    times `staleness_discount(lag)`, 0 from `max_staleness + 1` versions behind.
    """
    lag = own_version - partner.version
    if lag > cfg.max_staleness:
        return 0.0
    a = cfg.mix_weight
    if cfg.token_weighting:
        t_j = counted_tokens(cfg, own_tokens, partner.tokens)
        total = max(0, own_tokens) + t_j
        a = 2 * cfg.mix_weight * t_j / total if total > 0 else cfg.mix_weight
    a *= staleness_discount(cfg, lag)
    return float(min(1.0, max(0.0, a)))


def mix_slice_(state: OuterState, partner: PartnerState, a: float, momentum: Momentum, i: int, j: int,
               theirs: torch.Tensor | None = None) -> None:
    """Mix the slice `[i, j)` of a partner's state into ours with weight `a`: the anchor
    `phi <- (1-a) phi + a phi_j`, the momentum as `momentum` says. `theirs`: the partner's anchor
    slice already decoded (a caller that needs it for something else decodes it once)."""
    blend_(state.phi[i:j], partner.phi[i:j] if theirs is None else theirs, a)
    if partner.m is not None:
        momentum.mix_(state.m[i:j], partner.m[i:j], a, partner.m_scale)


def mix(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig, momentum: Momentum,
        bounds: list[tuple[int, int]] | None = None) -> None:
    """Mix a partner's state into ours in place with weight `a`, slice by slice (`mix_slice_`; the
    slices `bounds`, by default of `CHUNK` values: an island passes its parameters' slices), then
    the counters (`mix_counters_`)."""
    if a <= 0:
        return
    n = state.phi.numel()
    for i, j in bounds or [(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]:
        mix_slice_(state, partner, a, momentum, i, j)
    mix_counters_(state, partner, a, cfg)


def mix_counters_(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig) -> None:
    """The counters part of `mix`: the version the max of both but at most `max_version_jump` above
    our own, the tokens the weighted mean with the partner's counted as `counted_tokens`."""
    state.version = max(state.version, min(partner.version, state.version + cfg.max_version_jump))
    state.tokens = round((1 - a) * state.tokens + a * counted_tokens(cfg, state.tokens, partner.tokens))
