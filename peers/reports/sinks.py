"""Where each round's figures go besides `metrics.jsonl`: sinks behind one protocol.

`metrics.jsonl` (`peers.reports.metrics.MetricsLog`) is the source; it hands each round's row to
its sinks (`MetricSink`: `write(figures)`, `close()`). A `SinkFactory` builds them: by default
`peers.reports.trackers.build_sinks`, the trackers `LogConfig.to` names (TensorBoard, Weights &
Biases), given to the island as `peers.parts.IslandParts.sinks`; a test or a benchmark gives
another. Every tracker sees the same figures under the same tags (`scalars`, `texts`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2p_diloco.tracking import LogConfig

RoundFigures = Mapping[str, Any]
"""One round's row of `metrics.jsonl` (`peers.reports.island.IslandReports._log_round` documents it)."""

SCALARS: tuple[tuple[str, str], ...] = (
    ("loss/train", "loss"), ("loss/eval", "eval_loss"),
    ("throughput/tokens_per_s", "tokens_per_s"),
    ("time/utilization", "utilization"), ("time/wall_s", "wall_s"), ("time/inner_s", "inner_s"),
    ("time/publish_s", "publish_s"),
    ("progress/tokens", "own_tokens"), ("progress/swarm_tokens", "tokens"), ("progress/version", "version"),
    ("progress/budget", "budget"), ("progress/eta_s", "eta_s"),
    ("inner/lr", "lr"), ("outer/lr", "outer_lr"),
    ("gossip/mixes", "mixes"), ("gossip/refused", "refused"), ("gossip/weight", "weight"),
    ("gossip/staleness", "staleness"), ("gossip/bytes_in", "bytes_in"), ("gossip/bytes_out", "bytes_out"),
    ("gossip/coalesced", "coalesced"),
)
"""(tag, the row's field) of every number a tracker gets each round, under stable tags; plus where
the round's time went, `spent/<part>_s` for each part of its `spent` (`peers.rounds.timebook`)."""
TEXTS: tuple[tuple[str, str], ...] = (("gossip/partner", "partner_name"), ("gossip/alone", "alone"))
"""(tag, the row's field) of the words a tracker gets, when the round has them."""


class MetricSink(Protocol):
    """Takes each round's figures somewhere (a tracker); `close` at the island's end."""

    def write(self, figures: RoundFigures) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunInfo:
    """What a sink knows of the island it reports."""

    run_dir: Path
    name: str
    """The island's name (`Identity.name`): a W&B run's name."""
    run_id: str = ""
    """The swarm's run (`DiscoveryConfig.run_id`): a W&B run's group."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The island's settings by section (a W&B run's config; never the swarm secret)."""

    @staticmethod
    def settings_of(**sections: Any) -> dict[str, Any]:
        """Config dataclasses by name as plain JSON values (paths as strings)."""
        return {k: json.loads(json.dumps(dataclasses.asdict(v), default=str)) for k, v in sections.items()}


SinkFactory = Callable[[LogConfig, RunInfo], Sequence[MetricSink]]
"""Builds an island's sinks (`IslandParts.sinks`)."""


def scalars(figures: RoundFigures) -> dict[str, float]:
    """The round's numbers by tag (`SCALARS`; a field the round lacks or left None is left out)."""
    out = {tag: float(figures[key]) for tag, key in SCALARS
           if isinstance(figures.get(key), (int, float)) and not isinstance(figures.get(key), bool)}
    spent = figures.get("spent")
    if isinstance(spent, Mapping):
        out.update((f"spent/{part}_s", float(v)) for part, v in spent.items() if isinstance(v, (int, float)))
    return out


def texts(figures: RoundFigures) -> dict[str, str]:
    """The round's words by tag (`TEXTS`)."""
    return {tag: str(figures[key]) for tag, key in TEXTS if figures.get(key)}
