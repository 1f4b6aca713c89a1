"""The experiment trackers a round's figures go to (`peers.reports.sinks.MetricSink`s): TensorBoard
event files and a Weights & Biases run, and `build_sinks`, the island's default `SinkFactory`.

Each imports its package when built, never before (both are optional extras, checked installed
before an island starts: `p2p_diloco.tracking.require_trackers`). Both write under the island's
run directory; both take a round's figures as `sinks.scalars` and `sinks.texts` tag them, the
round as the step.
"""

from __future__ import annotations

import os
from pathlib import Path

from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.reports.sinks import MetricSink, RoundFigures, RunInfo, scalars, texts
from p2p_diloco.tracking import LogConfig, require_trackers


class TensorBoardSink:
    """Scalars (and the partner's name as text) in TensorBoard event files under `log_dir`
    (`tensorboard --logdir RUN_DIR/tensorboard`), flushed each round."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, figures: RoundFigures) -> None:
        step = int(figures["round"])
        for tag, value in scalars(figures).items():
            self._writer.add_scalar(tag, value, step)
        for tag, text in texts(figures).items():
            self._writer.add_text(tag, text, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One W&B run per island start: named as the island, grouped by the swarm's run id, its settings
    as the run's config, under `RUN_DIR/wandb`. Offline unless `WANDB_MODE` is set (a machine that
    trains may have no route to W&B; `wandb sync RUN_DIR/wandb/offline-run-*` uploads it later).
    The console is not captured: the island's own lines stay as they are."""

    def __init__(self, run: RunInfo, project: str) -> None:
        import wandb

        # (process-wide: W&B's own analytics follow the process's mode, not the run's, and would reach
        # W&B's servers at exit otherwise)
        mode = os.environ.setdefault("WANDB_MODE", "offline") or "offline"
        try:
            self._run = wandb.init(project=project, name=run.name, group=run.run_id or None, dir=str(run.run_dir),
                                   config=dict(run.settings), mode=mode, reinit="create_new",
                                   settings=wandb.Settings(console="off", silent=True, save_code=False))
        except Exception as e:  # (a wrong WANDB_MODE, online without `wandb login`, ...)
            raise ConfigError(f"W&B could not start the island's run (WANDB_MODE={mode}): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e

    def write(self, figures: RoundFigures) -> None:
        self._run.log({**scalars(figures), **texts(figures)}, step=int(figures["round"]))

    def close(self) -> None:
        self._run.finish()


def build_sinks(log: LogConfig, run: RunInfo) -> list[MetricSink]:
    """The trackers `log.to` names, for the island `run` (a `ConfigError` when one's package is missing)."""
    require_trackers(log.to)
    sinks: list[MetricSink] = []
    try:
        for tracker in log.to:
            sinks.append(TensorBoardSink(run.run_dir / "tensorboard") if tracker == "tensorboard"
                         else WandbSink(run, log.wandb_project))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
