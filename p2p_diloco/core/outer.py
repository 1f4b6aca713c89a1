"""The outer loop's mathematics: pseudo-gradient, mixing with a partner, outer Nesterov step.

Pure functions on flat fp32 tensors, no model and no network, so the simulator and the real
islands share them exactly and the unit tests can check them against hand-computed values.

Notation (docs/DESIGN.md, section 2): `phi` anchor, `m` outer momentum, `delta = phi - theta` the
pseudo-gradient of one round, `a` the partner's mixing weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.core.params import CHUNK


@dataclass
class OuterState:
    """An island's outer state: anchor, momentum, the last pseudo-gradient, version and tokens.

    `delta` is the pseudo-gradient of the island's latest round, kept (and published) only when
    partners average pseudo-gradients (`mix_pseudo_gradient`); otherwise None, which saves a full
    copy of the state.
    """

    phi: torch.Tensor
    m: torch.Tensor
    delta: torch.Tensor | None
    version: int = 0
    tokens: int = 0

    @classmethod
    def fresh(cls, phi: torch.Tensor, keep_delta: bool = True) -> "OuterState":
        phi = phi.detach().float().clone()
        return cls(phi=phi, m=torch.zeros_like(phi), delta=torch.zeros_like(phi) if keep_delta else None)

    def clone(self) -> "OuterState":
        delta = None if self.delta is None else self.delta.clone()
        return OuterState(self.phi.clone(), self.m.clone(), delta, self.version, self.tokens)


@dataclass(frozen=True)
class PartnerState:
    """A partner's published state as it arrived: fp32 tensors, or `codecs.EncodedVector`s decoded
    to fp32 a slice at a time as they are mixed (the receiver always accumulates in fp32)."""

    phi: torch.Tensor
    m: torch.Tensor | None
    delta: torch.Tensor | None
    version: int
    tokens: int
    peer: str = ""
    extra: dict = field(default_factory=dict)


def nesterov_(phi: torch.Tensor, m: torch.Tensor, delta: torch.Tensor, lr: float, mu: float) -> None:
    """Outer Nesterov step in place: `m <- mu m + delta`, `phi <- phi - lr (delta + mu m)`.

    Works on whole vectors or on matching slices of them (an island steps slice by slice).
    """
    m.mul_(mu).add_(delta)
    phi.sub_(delta + mu * m, alpha=lr)


def nesterov_step(state: OuterState, delta: torch.Tensor, lr: float, mu: float) -> None:
    """`nesterov_` on an island's whole anchor and momentum."""
    nesterov_(state.phi, state.m, delta, lr, mu)


def mixing_weight(cfg: DiLoCoConfig, own_version: int, own_tokens: int, partner: PartnerState) -> float:
    """Weight `a` of a partner's state; 0 means skip it.

    Token weighting: `a = 2 * mix_weight * t_j / (t_i + t_j)`, so equal tokens give `mix_weight`
    and a partner with far more training (a joiner meeting the swarm) approaches 1. Staleness: a
    partner `lag` versions behind is multiplied by `1 - staleness_decay * lag / max_staleness`
    and skipped beyond `max_staleness`.
    """
    lag = own_version - partner.version
    if lag > cfg.max_staleness:
        return 0.0
    a = cfg.mix_weight
    if cfg.token_weighting:
        total = own_tokens + partner.tokens
        a = 2 * cfg.mix_weight * partner.tokens / total if total > 0 else cfg.mix_weight
    if lag > 0 and cfg.max_staleness > 0:
        a *= 1 - cfg.staleness_decay * lag / cfg.max_staleness
    return float(min(1.0, max(0.0, a)))


def blend_(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    """`x <- (1-a) x + a y` in place; written so that a=1/2 is exactly symmetric in x and y.

    When `y` lives on another device (a fetched state on the host, the anchor on an accelerator),
    or is still encoded (`codecs.EncodedVector`), it moves over and decodes slice by slice, so mixing
    runs where `x` is without a second full copy.
    """
    if isinstance(y, torch.Tensor) and y.device == x.device:
        return x.mul_(1 - a).add_(y, alpha=a)
    for i in range(0, x.numel(), CHUNK):
        x[i : i + CHUNK].mul_(1 - a).add_(y[i : i + CHUNK].to(x.device, non_blocking=True), alpha=a)
    return x


def mix(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig) -> None:
    """Mix a partner's state into ours in place with weight `a`.

    The anchor always mixes; momentum mixes only in `momentum="mixed"` mode (else each island
    keeps its own, as in NoLoCo); the stored pseudo-gradient mixes when `mix_pseudo_gradient`.
    The version becomes the max of both; tokens become the weighted mean.
    """
    if a <= 0:
        return
    mix_values_(state, partner, a, cfg)
    mix_counters_(state, partner, a)


def mix_values_(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig, i: int = 0,
                j: int | None = None) -> None:
    """The values part of `mix`, on the slice `[i, j)` of the vectors (all of them by default)."""
    blend_(state.phi[i:j], partner.phi[i:j], a)
    if cfg.momentum == "mixed" and partner.m is not None:
        blend_(state.m[i:j], partner.m[i:j], a)


def mix_counters_(state: OuterState, partner: PartnerState, a: float) -> None:
    """The counters part of `mix`: version the max of both, tokens the weighted mean."""
    state.version = max(state.version, partner.version)
    state.tokens = round((1 - a) * state.tokens + a * partner.tokens)


def outer_update(state: OuterState, delta: torch.Tensor, partners: list[tuple[PartnerState, float]],
                 cfg: DiLoCoConfig, arrived: list[tuple[PartnerState, float]] = ()) -> None:
    """End of a round for one island: mix partner anchors, then one Nesterov step.

    The partners' states were published one round earlier than our `delta` was computed: they
    are contemporaneous with our anchor *before* this round's step, so they are mixed into that
    anchor first and our own step follows. That applies a partner's correction relative to the
    state it was computed against, and never pulls our fresh step back toward an old state.
    `arrived` are partners already mixed during the round (`OuterLoop.mix_arrived`); with
    `mix_pseudo_gradient`, the step uses our delta averaged with all partners' last deltas.
    """
    used = delta
    for partner, a in partners:
        mix(state, partner, a, cfg)
    for partner, a in [*arrived, *partners]:
        if cfg.mix_pseudo_gradient and partner is not None and partner.delta is not None and a > 0:
            used = blend_(used.clone(), partner.delta, a)
    nesterov_step(state, used, cfg.outer_lr, cfg.outer_momentum)
    if state.delta is not None:
        state.delta = delta.clone()
    state.version += 1
