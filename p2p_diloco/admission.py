"""Which checks a partner's state gets before it is mixed, in which order, and each check's settings.

Plain Python (no torch), like `p2p_diloco.config`: the checks themselves are `peers.admission`'s,
registered by name; this is what a run chooses of them. Every constant a check tunes lives in its
own section here, documented with the figure that set it (BENCHMARKS.md, "Robustness").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from p2p_diloco.errors import ConfigError, require

CHECKS = ("identity", "claims", "momentum", "gate", "clip", "trust", "drift", "probe")
"""Every check there is, in the default order: the state's model and run first, its claims counted
before anything reads them, the two refusals of what no honest partner sends (a momentum beyond what
pseudo-gradients sum to, a state as far as the weights are large), then the weight's bounds, all from
one principle (the island's own progress per round, `D`): the move clipped around the island's own
state, the partner's record over time, the swarm's drift over time, and last the probe, which judges
the mix at the weight the others allow."""


def _require(cond: bool, section: str, name: str, rule: str, value: object) -> None:
    require(cond, f"admission.{section}", name, rule, value)


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
    """`momentum` and `clip`: bounds in rounds of the island's own progress `D` (`core.influence`)."""

    history: int = 8
    """Rounds of the island's own progress remembered."""
    clip: float = 2.0
    """`clip`: a partner's difference from the island's state is clipped so that a mix moves the anchor by
    at most this many of the island's rounds of progress (honest mixes move it by 0.5-0.65)."""
    momentum_ratio: float = 3.0
    """`momentum`: a partner's momentum may be this many times the norm an honest one reaches."""
    momentum_clip: float = 1.25
    """`momentum`: a partner's momentum is mixed at most this many times the norm of the island's own
    (a momentum x3 mixed as it came: +1.8% on the worst honest island)."""
    far_rounds: float = 8.0
    """A state this many rounds away and `STALE_LAG` versions ahead shows the island stale: it catches up."""

    def __post_init__(self) -> None:
        for name in ("clip", "momentum_ratio", "momentum_clip", "far_rounds"):
            _require(getattr(self, name) > 0, "bounds", name, "> 0", getattr(self, name))
        _require(self.history >= 1, "bounds", "history", ">= 1", self.history)


@dataclass(frozen=True, kw_only=True)
class GateSettings:
    """`gate`: a state as far from the island's as the island's weights are large is no partner's."""

    bound: float = 1.0
    """The most relative distance `|phi_j - phi_i| / |phi_i|` (a random or another run's state lands near
    sqrt 2, weights x1e6 far beyond; honest islands that trained apart for 600 rounds of H=5 sat at 0.93)."""

    def __post_init__(self) -> None:
        _require(self.bound > 0, "gate", "bound", "> 0", self.bound)


@dataclass(frozen=True, kw_only=True)
class TrustSettings:
    """`trust`: each partner's record, over its states, of how far back they sat and what their mixes did."""

    behind: float = 0.5
    """Rounds back along the island's progress (beyond its lag) an honest state reaches: a state of the
    same version lacks the part of the island's last step its own did not share (-0.06 to 0.63 rounds
    in `bench attack`'s clean run, where `alie`'s sat 1.1-2.5 and `ipm`'s 0.5-2.1: at 1.0 most of
    `ipm`'s were mixed whole)."""
    slack: float = 0.25
    """A partner whose record (rounds back beyond `behind`, and its mixes' rise of the held-out loss in
    the probe's tolerance, averaged) stays within this is mixed as it comes; beyond, at `slack / record`."""
    memory: float = 0.7
    """What a partner's record keeps at each thing it takes in."""
    step: float = 0.1
    """Rounds of the island's progress one mix may take back beyond what an honest state of its lag does:
    a state `x` rounds further back than `behind` is mixed at `step / x` at most, from its first state on."""
    agree: float = 1.0
    """How far a member's report of a partner (`IslandRecord.doubts`) may lie from this island's own record
    of it: a member that reports one partner farther off than this is not heard on any."""

    def __post_init__(self) -> None:
        _require(self.behind >= 0, "trust", "behind", ">= 0", self.behind)
        _require(self.step > 0, "trust", "step", "> 0", self.step)
        _require(self.slack > 0, "trust", "slack", "> 0", self.slack)
        _require(0 <= self.memory < 1, "trust", "memory", "in [0, 1)", self.memory)
        _require(self.agree > 0, "trust", "agree", "> 0", self.agree)


@dataclass(frozen=True, kw_only=True)
class DriftSettings:
    """`drift`: what the partners' mixes moved the island, all partners together."""

    rounds: float = 4.0
    """Rounds of the island's own progress the partners' mixes may move it along one direction."""
    decay: float = 0.9
    """What remains of the sum at each mix (decayed per round instead, a member mixed every third round
    kept 2.7 of the 4 rounds free at each mix)."""

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
    trust: TrustSettings = field(default_factory=TrustSettings)
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

    @classmethod
    def from_table(cls, table: dict) -> AdmissionConfig:
        """The config file's `[admission]` table: `checks = [...]`, and one sub-table per settings section
        (`[admission.trust]`, ...), each field checked by name and by its section's own rules."""
        if not isinstance(table, dict):
            raise ConfigError(f"[admission] must be a table, got {table!r}")
        sections = {f.name: f for f in dataclasses.fields(cls) if f.name != "checks"}
        out: dict = {}
        for key, value in table.items():
            if key == "checks":
                if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"admission.checks must be a list of check names, got {value!r}")
                out["checks"] = tuple(value)
            elif key in sections:
                kind = sections[key].default_factory
                known = [f.name for f in dataclasses.fields(kind)]
                if not isinstance(value, dict) or any(k not in known for k in value):
                    raise ConfigError(f"[admission.{key}] takes {', '.join(known)}; got {value!r}")
                out[key] = kind(**value)
            else:
                raise ConfigError(f"[admission] has no {key!r}; known: checks, {', '.join(sections)}")
        return cls(**out)
