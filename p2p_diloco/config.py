"""Configuration as frozen dataclasses, one per section, validated once at construction.

Precedence (applied by the CLI): command-line flag > environment variable `P2P_DILOCO_*` > TOML
file (`--config FILE`) > the defaults below. Every field is documented right under it; every
`__post_init__` names the field and its allowed range when a value is rejected.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_diloco.errors import ConfigError

MOMENTUM_MODES = ("mixed", "local")


def _require(cond: bool, section: str, field: str, rule: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{section}.{field} must be {rule}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The GPT's shape. `size` picks a named preset; explicit dimensions override it."""

    size: str = "tiny"
    """Named preset: `tiny` (~1M parameters, tests and CPU demos) or `small` (~10-20M)."""
    n_layer: int | None = None
    """Transformer blocks (overrides the preset)."""
    n_head: int | None = None
    """Attention heads per block (overrides the preset)."""
    n_embd: int | None = None
    """Width of the residual stream (overrides the preset); must be divisible by n_head."""
    block_size: int | None = None
    """Context length in bytes (overrides the preset)."""
    dropout: float = 0.0
    """Dropout probability in attention and MLP (0 for short runs)."""

    def __post_init__(self) -> None:
        from p2p_diloco.model import PRESETS  # the presets live beside the model

        _require(self.size in PRESETS, "model", "size", f"one of {sorted(PRESETS)}", self.size)
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            v = getattr(self, name)
            _require(v is None or (isinstance(v, int) and v >= 1), "model", name, "a positive integer", v)
        _require(0.0 <= self.dropout < 1.0, "model", "dropout", "in [0, 1)", self.dropout)
        dims = self.resolved()
        _require(dims["n_embd"] % dims["n_head"] == 0, "model", "n_embd", "divisible by n_head", dims["n_embd"])

    def resolved(self) -> dict[str, int]:
        """The preset with explicit overrides applied: n_layer, n_head, n_embd, block_size."""
        from p2p_diloco.model import PRESETS

        dims = dict(PRESETS[self.size])
        for name in dims:
            if getattr(self, name) is not None:
                dims[name] = getattr(self, name)
        return dims


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The inner (local) optimizer: AdamW with warmup, cosine decay and gradient clipping."""

    batch_size: int = 16
    """Sequences per inner step on one island."""
    lr: float = 3e-3
    """Peak inner learning rate."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of `lr`."""
    warmup_steps: int = 50
    """Linear warmup steps of the inner learning rate."""
    total_steps: int = 2000
    """Inner steps over which the cosine schedule decays (the island's expected step count)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""
    seed: int = 0
    """Seed for model initialisation and data order."""

    def __post_init__(self) -> None:
        s = "train"
        _require(self.batch_size >= 1, s, "batch_size", ">= 1", self.batch_size)
        _require(0 < self.lr <= 1, s, "lr", "in (0, 1]", self.lr)
        _require(0 <= self.min_lr_ratio <= 1, s, "min_lr_ratio", "in [0, 1]", self.min_lr_ratio)
        _require(self.warmup_steps >= 0, s, "warmup_steps", ">= 0", self.warmup_steps)
        _require(self.total_steps >= 1, s, "total_steps", ">= 1", self.total_steps)
        _require(self.weight_decay >= 0, s, "weight_decay", ">= 0", self.weight_decay)
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, s, "beta1/beta2", "in [0, 1)", (self.beta1, self.beta2))
        _require(self.grad_clip >= 0, s, "grad_clip", ">= 0", self.grad_clip)


@dataclass(frozen=True, kw_only=True)
class DiLoCoConfig:
    """The outer loop: rounds of H inner steps, gossip mixing, outer Nesterov step."""

    local_steps: int = 50
    """H: inner steps per round (`max_local_steps`; a slow island may do fewer within `round_seconds`)."""
    round_seconds: float | None = None
    """Wall-clock budget of one round's inner steps; None means H steps whatever they take."""
    outer_lr: float = 0.7
    """Outer Nesterov learning rate."""
    outer_momentum: float = 0.9
    """Outer Nesterov momentum mu."""
    momentum: str = "local"
    """`mixed`: outer momentum mixed along with the weights; `local`: each island keeps its own."""
    mix_weight: float = 0.5
    """Base weight of a partner's state when both have equal tokens and no staleness."""
    token_weighting: bool = True
    """Scale the partner's weight by its share of tokens (a fresh joiner counts less)."""
    max_staleness: int = 8
    """A partner more than this many versions behind is skipped."""
    staleness_decay: float = 0.5
    """Each version a partner is behind multiplies its weight by (1 - staleness_decay * lag / max_staleness)."""
    mix_pseudo_gradient: bool = True
    """Average the pseudo-gradient with the partner's last one as well (NoLoCo style)."""
    partners: int = 1
    """k: partner states mixed per round (1 = pairwise gossip)."""

    def __post_init__(self) -> None:
        s = "diloco"
        _require(self.local_steps >= 1, s, "local_steps", ">= 1", self.local_steps)
        _require(self.round_seconds is None or self.round_seconds > 0, s, "round_seconds", "> 0 or unset", self.round_seconds)
        _require(0 < self.outer_lr <= 2, s, "outer_lr", "in (0, 2]", self.outer_lr)
        _require(0 <= self.outer_momentum < 1, s, "outer_momentum", "in [0, 1)", self.outer_momentum)
        _require(self.momentum in MOMENTUM_MODES, s, "momentum", f"one of {MOMENTUM_MODES}", self.momentum)
        _require(0 < self.mix_weight <= 1, s, "mix_weight", "in (0, 1]", self.mix_weight)
        _require(self.max_staleness >= 0, s, "max_staleness", ">= 0", self.max_staleness)
        _require(0 <= self.staleness_decay <= 1, s, "staleness_decay", "in [0, 1]", self.staleness_decay)
        _require(self.partners >= 1, s, "partners", ">= 1", self.partners)


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a TOML config file into `{section: {field: value}}`; unknown sections are an error."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    return data


def build(cls: type, section: str, values: dict[str, Any]) -> Any:
    """Construct config section `cls` from a dict, rejecting unknown fields by name."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown field(s) in [{section}]: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"[{section}]: {e}") from e
