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

MOMENTUM_CODECS = {"mixed-int4": "int4", "alternate-int4": "int4", "rescaled-int4": "int4", "rescaled-sign": "sign"}
"""Momentum modes that publish the momentum with a coarser codec than the weights'."""
BUFFER_MODES = ("mixed", "mixed-int4", "alternate", "alternate-int4", "same-version", "rescaled",
                "rescaled-int4", "rescaled-sign")
"""Momentum modes that blend the partner's momentum buffer into ours, like the anchor (issue 15, item 2):
`mixed` as published (the weights' codec: twice the bytes), `mixed-int4` in 4 bits, `alternate` published on even versions only (`alternate-int4`: with 4 bits), `same-version`
fetched and mixed only from a partner at our version, `rescaled` mixed and then scaled to the interpolated
norm of the two buffers (directions that disagree no longer shrink it; `rescaled-int4`: with 4 bits,
`rescaled-sign`: signs and a mean magnitude per block). Two more modes mix no buffer:
`partner-delta` adds `a` times the partner's last pseudo-gradient minus ours (the newest term of the
buffer), `noloco` carries the mixing shift of the anchor into the momentum as NoLoCo's modified Nesterov
step does (nothing extra on the wire)."""


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

    The anchor always mixes; the momentum as `mix_momentum_` says (with `momentum="local"` each
    island keeps its own); counters as `mix_counters_`.
    """
    if a <= 0:
        return
    mix_values_(state, partner, a, cfg)
    mix_counters_(state, partner, a, cfg)


def mix_values_(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig, i: int = 0,
                j: int | None = None) -> None:
    """The values part of `mix`, on the slice `[i, j)` of the vectors (all of them by default)."""
    before = state.phi[i:j].clone() if cfg.momentum == "noloco" else None
    blend_(state.phi[i:j], partner.phi[i:j], a)
    mix_momentum_(state, partner, a, cfg, i, j, None if before is None else state.phi[i:j] - before)


def publishes_momentum(cfg: DiLoCoConfig, version: int) -> bool:
    """Whether an island at `version` publishes its momentum buffer."""
    return cfg.momentum in BUFFER_MODES and (not cfg.momentum.startswith("alternate") or version % 2 == 0)


def publishes_delta(cfg: DiLoCoConfig) -> bool:
    """Whether an island publishes its last pseudo-gradient."""
    return cfg.mix_pseudo_gradient or cfg.momentum == "partner-delta"


def wants_momentum(cfg: DiLoCoConfig, own_version: int, partner_version: int) -> bool:
    """Whether a receiver fetches and mixes a partner's published momentum buffer."""
    return cfg.momentum in BUFFER_MODES and (cfg.momentum != "same-version" or partner_version == own_version)


def mix_momentum_(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig, i: int = 0,
                  j: int | None = None, shift: torch.Tensor | None = None) -> None:
    """The momentum part of mixing on the slice `[i, j)` (`BUFFER_MODES` says what each mode does);
    `shift` is the anchor's move by this mix, `a (phi_j - phi)`, which `noloco` needs."""
    mode, m = cfg.momentum, state.m[i:j]
    if mode in BUFFER_MODES:
        if partner.m is None or not wants_momentum(cfg, state.version, partner.version):
            return
        theirs = partner.m[i:j].to(m.device, non_blocking=True)
        target = (1 - a) * m.norm() + a * theirs.norm() if mode.startswith("rescaled") else None
        blend_(m, theirs, a)
        if target is not None and (norm := m.norm()) > 0:
            m.mul_(target / norm)
    elif mode == "partner-delta" and partner.delta is not None and state.delta is not None:
        m.add_(partner.delta[i:j].to(m.device, non_blocking=True) - state.delta[i:j], alpha=a)
    elif mode == "noloco" and shift is not None:
        m.sub_(shift.to(m.device), alpha=1 / cfg.outer_lr)


def mix_counters_(state: OuterState, partner: PartnerState, a: float, cfg: DiLoCoConfig) -> None:
    """The counters part of `mix`: the version the max of both but at most `max_version_jump` above
    our own, the tokens the weighted mean with the partner's counted as `counted_tokens`."""
    state.version = max(state.version, min(partner.version, state.version + cfg.max_version_jump))
    state.tokens = round((1 - a) * state.tokens + a * counted_tokens(cfg, state.tokens, partner.tokens))


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
