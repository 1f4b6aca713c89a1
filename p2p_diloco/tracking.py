"""Where each round's figures go besides `metrics.jsonl`: the `[log]` section (`join --log-to`).

`metrics.jsonl` in the run directory is always written and stays the source; `LogConfig.to` adds
experiment trackers, each an optional extra of the package (`pip install 'p2p-diloco[tensorboard]'`,
`[wandb]`). Whether a tracker's package is installed is checked before an island starts
(`require_trackers`), so that a missing one is a one-line error, not a failure rounds later.
The sinks themselves are `p2p_diloco.peers.reports.sinks`.

Plain Python (no torch, and the trackers' packages are only looked up, never imported here).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from p2p_diloco.errors import ConfigError

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""The trackers `LogConfig.to` may name, each with the package (and the extra of the same name) it needs."""


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """Where each round's figures go besides `metrics.jsonl` (the config file's `[log]` table)."""

    to: tuple[str, ...] = ()
    """Trackers of `TRACKERS`: `tensorboard` writes event files to `<run_dir>/tensorboard`, `wandb` a
    Weights & Biases run under `<run_dir>/wandb`, named as the island, offline unless the
    environment's `WANDB_MODE` says otherwise (`wandb sync` uploads an offline run later)."""
    wandb_project: str = "p2p-diloco"
    """The W&B project of the island's run (its group is the swarm's `run_id`)."""

    def __post_init__(self) -> None:
        to = (self.to,) if isinstance(self.to, str) else self.to
        if not isinstance(to, (tuple, list)) or not all(isinstance(t, str) and t in TRACKERS for t in to):
            raise ConfigError(f"log.to must be a list of {', '.join(TRACKERS)}, got {self.to!r}")
        object.__setattr__(self, "to", tuple(dict.fromkeys(to)))  # (in order, each once)
        if not (isinstance(self.wandb_project, str) and self.wandb_project.strip()):
            raise ConfigError(f"log.wandb_project must be a project name, got {self.wandb_project!r}")


def parse_trackers(value: Any) -> tuple[str, ...]:
    """`--log-to tensorboard,wandb` (or a config file's list) as a tuple of names; "" or "none": none."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(str(v).strip() for v in items if str(v).strip() and str(v).strip() != "none")
    return LogConfig(to=names).to


def missing_trackers(to: tuple[str, ...]) -> list[str]:
    """The trackers of `to` whose package is not installed (looked up, not imported)."""
    return [t for t in to if importlib.util.find_spec(TRACKERS[t]) is None]


def require_trackers(to: tuple[str, ...]) -> None:
    """A one-line `ConfigError` naming the extra to install when a tracker of `to` is missing."""
    if missing := missing_trackers(to):
        extras = ",".join(missing)
        raise ConfigError(f"logging to {' and '.join(missing)} needs the package{'s' if len(missing) > 1 else ''} "
                          f"{' and '.join(TRACKERS[m] for m in missing)}: pip install 'p2p-diloco[{extras}]'")
