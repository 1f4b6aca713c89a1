"""Which checks a partner's state gets before it is mixed, in which order, and each check's settings.

Plain Python (no torch), like `p2p_diloco.config`: the checks themselves are `peers.admission`'s,
registered by name; this is what a run chooses of them. Every constant a check tunes lives in its
own section here, documented with the figure that set it (BENCHMARKS.md, "Robustness").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2p_diloco.errors import ConfigError

CHECKS = ("identity", "claims", "momentum", "size", "behind", "gate", "influence", "drift", "probe")
"""Every check there is, in the default order: the state's model and run first, its claims counted
before any bound reads them, the bounds that refuse before those that cap, the probe last (it judges
the mix at the weight the others allow)."""


def _require(cond: bool, section: str, name: str, rule: str, value: object) -> None:
    if not cond:
        raise ConfigError(f"admission.{section}.{name} must be {rule}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ClaimsSettings:
    """`claims`: what a partner says of itself, counted as far as the island can check it."""

    version_ahead: int = 1
    """Versions a partner may be counted ahead of this island and of the members' median."""
    token_rate: float = 1.25
    """A partner's tokens per version counted, at most, in rounds of this island's own tokens (at 1.5
    per version and one more, a member claiming x1000 still had its first states mixed at 0.69-0.75)."""

    def __post_init__(self) -> None:
        _require(self.version_ahead >= 0, "claims", "version_ahead", ">= 0", self.version_ahead)
        _require(self.token_rate >= 1, "claims", "token_rate", ">= 1", self.token_rate)


@dataclass(frozen=True, kw_only=True)
class BoundsSettings:
    """`momentum`, `size`, `behind` and `influence`: bounds in rounds of the island's own progress `D`."""

    history: int = 8
    """Rounds of the island's own progress remembered."""
    clip: float = 2.0
    """`influence`: a partner moves the anchor by at most this many of the island's own rounds' progress."""
    momentum_ratio: float = 3.0
    """`momentum`: a partner's momentum may be this many times the norm an honest one reaches."""
    momentum_clip: float = 1.25
    """`momentum`: a partner's momentum is mixed at most this many times the norm of the island's own
    (a momentum x3 mixed as it came: +1.8% on the worst honest island)."""
    size_rounds: float = 2.0
    """`size`: a state's anchor norm may differ from the island's own by this many rounds."""
    behind_rounds: float = 1.5
    """`behind`: a state may sit this many rounds back along the island's progress, beyond its lag."""
    start_rounds: float = 8.0
    """`gate`: its bound before it learned distances, in rounds (a fixed 1.0 let an anchor x1.5 through)."""
    apart_after: int = 8
    """Rounds without a mix after which the size, behind and gate bounds widen."""
    apart_most: float = 12.0
    """The most rounds of progress that widening adds (an anchor x1.5 sat 23 rounds off the tiny
    preset's own early on)."""

    def __post_init__(self) -> None:
        for name in ("clip", "momentum_ratio", "momentum_clip", "size_rounds", "behind_rounds", "start_rounds"):
            _require(getattr(self, name) > 0, "bounds", name, "> 0", getattr(self, name))
        _require(self.history >= 1 and self.apart_after >= 0, "bounds", "history/apart_after", ">= 1 and >= 0",
                 (self.history, self.apart_after))
        _require(self.apart_most >= 0, "bounds", "apart_most", ">= 0", self.apart_most)


@dataclass(frozen=True, kw_only=True)
class GateSettings:
    """`gate`: a distance bound learned from the states the island accepted."""

    history: int = 32
    """Accepted distances remembered."""
    min_history: int = 4
    """Accepted distances needed before the learned bound replaces the start bound."""
    start_bound: float = 1.0
    """The bound on the relative distance until then (a random or another run's state lands near sqrt 2)."""
    ratio: float = 8.0
    """A state may be this many times farther than the median accepted one ..."""
    spread: float = 6.0
    """... or this many (normal-scaled) median absolute deviations above the median."""

    def __post_init__(self) -> None:
        _require(1 <= self.min_history <= self.history, "gate", "min_history", f"in [1, history={self.history}]",
                 self.min_history)
        for name in ("start_bound", "ratio", "spread"):
            _require(getattr(self, name) > 0, "gate", name, "> 0", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class DriftSettings:
    """`drift`: what each partner's mixes moved the island, remembered per partner."""

    rounds: float = 4.0
    """Rounds of the island's own progress one partner's mixes may move it along one direction."""
    decay: float = 0.9
    """What remains of a partner's sum at each of its mixes (decayed per round instead, a member mixed
    every third round kept 2.7 of the 4 rounds free at each mix)."""

    def __post_init__(self) -> None:
        _require(self.rounds > 0, "drift", "rounds", "> 0", self.rounds)
        _require(0 <= self.decay < 1, "drift", "decay", "in [0, 1)", self.decay)


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """`probe`: a mix judged by its effect on a held-out loss."""

    floor: float = 0.01
    """A mix may always raise the probe loss by this fraction of it (honest mixes late in a run: at
    most 0.9%; a state a round or two behind: 1.4-2%)."""
    rounds: float = 0.5
    """... or by this many of the island's own recent rounds of progress (relative drop per round)."""
    start: float = 0.05
    """The bound until the island measured its progress over a whole round."""
    window: float = 4.0
    """Rounds its progress is measured over."""

    def __post_init__(self) -> None:
        for name in ("floor", "rounds", "start", "window"):
            _require(getattr(self, name) > 0, "probe", name, "> 0", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class AdmissionConfig:
    """The checks a partner's state gets, in order, and their settings (`peers.admission`)."""

    checks: tuple[str, ...] = CHECKS
    """The checks, by name, in the order they run: the first refusal wins, caps take the smallest.
    `identity` must come first (nothing else reads a state of another model)."""
    claims: ClaimsSettings = field(default_factory=ClaimsSettings)
    bounds: BoundsSettings = field(default_factory=BoundsSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    drift: DriftSettings = field(default_factory=DriftSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    def __post_init__(self) -> None:
        checks = tuple(self.checks)
        object.__setattr__(self, "checks", checks)
        unknown = [c for c in checks if c not in CHECKS]
        if unknown:
            raise ConfigError(f"admission.checks: unknown check {unknown[0]!r}; known: {', '.join(CHECKS)}")
        if len(set(checks)) != len(checks):
            raise ConfigError(f"admission.checks names a check twice: {list(checks)}")
        if not checks or checks[0] != "identity":
            raise ConfigError(f"admission.checks must start with 'identity' (the state's model and run), got {list(checks)}")
