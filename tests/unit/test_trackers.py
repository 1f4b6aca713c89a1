"""Each round's figures where users already look (`peers/reports/sinks.py`, `trackers.py`): TensorBoard
event files and an offline W&B run beside `metrics.jsonl`, under stable tags; a tracker whose package
is missing is one line and exit code 2 before the island starts; the console line and the record
carry the learning rate, the time since the start and the share of the budget spent."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest
import torch
from click.testing import CliRunner
from tracker_files import tensorboard_scalars, wandb_history, wandb_records

import p2p_diloco
from p2p_diloco.cli import main
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import ConfigError, DiscoveryError
from p2p_diloco.peers.island import SwarmIsland
from p2p_diloco.peers.parts import IslandParts
from p2p_diloco.peers.reports.metrics import progress_line, read_metrics
from p2p_diloco.peers.reports.sinks import scalars, texts
from p2p_diloco.tracking import TRACKERS, LogConfig, parse_trackers

pytestmark = pytest.mark.timeout(120)
ROUNDS = 3


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def settings(run_dir, **island):
    return dict(discovery=DiscoveryConfig(discovery="zmq", run_id="trackers"), diloco=DiLoCoConfig(local_steps=2),
                island=IslandConfig(run_dir=run_dir, name="isle-1", quiet=True, join_timeout_s=0.2,
                                    max_rounds=ROUNDS, max_stretch=0.0, **island))


def train(island, model, optimizer) -> None:
    with island:
        while not island.done:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            island.step(loss=loss)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B as a machine with no route to it runs: no WANDB_MODE set, its own folders in `tmp_path`."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))


def test_a_runs_rounds_reach_tensorboard_and_an_offline_wandb_run(tmp_path, offline_wandb):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    pytest.importorskip("wandb", reason="the wandb extra is not installed")

    run_dir = tmp_path / "run"
    model, optimizer = model_and_optimizer()
    island = p2p_diloco.join(model, optimizer, log=LogConfig(to=("tensorboard", "wandb"), wandb_project="tests"),
                             **settings(run_dir))
    train(island, model, optimizer)
    rows = [r for r in read_metrics(run_dir) if "round" in r]  # metrics.jsonl stays the source
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert [r["budget"] for r in rows] == [round(k / ROUNDS, 4) for k in range(1, ROUNDS + 1)] and rows[-1]["eta_s"] == 0
    assert all(r["lr"] == 0.05 and r["outer_lr"] == DiLoCoConfig().outer_lr and r["mixes"] == 0 for r in rows)

    events = tensorboard_scalars(run_dir)
    tags = set(events)
    assert {"loss/train", "throughput/tokens_per_s", "time/utilization", "time/inner_s", "inner/lr",
            "outer/lr", "gossip/mixes", "gossip/refused", "gossip/bytes_in", "gossip/bytes_out", "progress/budget",
            "spent/inner_s", "spent/end_s"} <= tags
    loss = events["loss/train"]
    assert [e.step for e in loss] == [r["round"] for r in rows]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-6)

    records = wandb_records(run_dir)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.project, run.run_group) == ("isle-1", "tests", "trackers")
    history = wandb_history(records)
    assert [h["_step"] for h in history] == [r["round"] for r in rows]
    assert [h["loss/train"] for h in history] == pytest.approx([r["loss"] for r in rows])
    assert all(h["inner/lr"] == 0.05 for h in history)


class Recording:
    """A sink a test gives the island (`IslandParts.sinks`): keeps what it is given."""

    def __init__(self) -> None:
        self.rows, self.closed = [], False

    def write(self, figures) -> None:
        self.rows.append(dict(figures))

    def close(self) -> None:
        self.closed = True


class Failing(Recording):
    def write(self, figures) -> None:
        raise OSError("disk full")


def test_the_island_builds_its_sinks_through_its_parts_and_a_failing_one_is_dropped(tmp_path, caplog):
    recording, failing, asked = Recording(), Failing(), []

    def sinks(log, run):
        asked.append((log, run))
        return [failing, recording]

    model, optimizer = model_and_optimizer()
    island = SwarmIsland(model, optimizer, parts=IslandParts(log=LogConfig(wandb_project="p"), sinks=sinks),
                         **settings(tmp_path))
    with caplog.at_level(logging.WARNING):
        train(island, model, optimizer)
    [(log, run)] = asked
    assert log.wandb_project == "p" and (run.run_dir, run.name, run.run_id) == (tmp_path, "isle-1", "trackers")
    assert run.settings["diloco"]["local_steps"] == 2 and "secret" not in json.dumps(run.settings)
    assert [r["round"] for r in recording.rows] == list(range(1, ROUNDS + 1)) and recording.closed
    assert caplog.text.count("Failing failed (OSError: disk full); no more rounds go there") == 1
    assert [r["round"] for r in read_metrics(tmp_path) if "round" in r] == list(range(1, ROUNDS + 1))


def test_a_tracker_whose_package_is_missing_is_one_line_and_exit_2_before_the_island_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(TRACKERS, "wandb", "p2p_diloco_no_such_package")
    started = []
    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island", lambda *a, **kw: started.append(1) or (0, {}))
    r = CliRunner().invoke(main, ["join", "--device", "cpu", "--run-dir", str(tmp_path), "--log-to", "tensorboard,wandb"])
    assert r.exit_code == 2 and not started, r.output
    assert r.output.strip().splitlines() == ["Error: logging to wandb needs the package p2p_diloco_no_such_package: "
                                             "pip install 'p2p-diloco[wandb]'"]
    model, optimizer = model_and_optimizer()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"pip install 'p2p-diloco\[wandb\]'"):
        p2p_diloco.join(model, optimizer, log=LogConfig(to=("wandb",)), **settings(tmp_path))
    assert time.monotonic() - t0 < 2 and not (tmp_path / "metrics.jsonl").exists()  # before discovery, nothing written
    assert not (tmp_path / "island.lock").exists()  # the directory is free again


def test_log_to_and_the_log_table_of_a_config_file(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island",
                        lambda *a, parts=None, **kw: seen.update(log=parts.log) or (0, {}))
    monkeypatch.setattr("p2p_diloco.cli.join.require_trackers", lambda to: None)  # (installed or not)
    config = tmp_path / "p2p.toml"
    config.write_text('[log]\nto = ["wandb", "tensorboard"]\nwandb_project = "mine"\n')
    for args, expected in (([], LogConfig(to=("wandb", "tensorboard"), wandb_project="mine")),
                           (["--log-to", "tensorboard"], LogConfig(to=("tensorboard",), wandb_project="mine")),
                           (["--log-to", "none"], LogConfig(wandb_project="mine"))):
        r = CliRunner().invoke(main, ["--config", str(config), "join", "--device", "cpu", "--run-dir", str(tmp_path / "r"),
                                      *args])
        assert r.exit_code == 0, r.output
        assert seen.pop("log") == expected
    config.write_text('[log]\ntoo = ["wandb"]\n')
    r = CliRunner().invoke(main, ["--config", str(config), "join", "--help"])
    assert r.exit_code == 2 and "[log] field 'too' is unknown; did you mean 'to'?" in r.output
    r = CliRunner().invoke(main, ["join", "--log-to", "tensorbord"])
    assert r.exit_code == 2 and "expected a comma-separated list of tensorboard, wandb" in r.output
    assert parse_trackers("wandb, tensorboard,wandb") == ("wandb", "tensorboard")


def test_every_tracker_gets_the_same_figures_under_stable_tags():
    row = {"round": 4, "loss": 2.5, "eval_loss": None, "tokens_per_s": 1e4, "utilization": 0.9, "lr": 1e-3,
           "outer_lr": 0.7, "mixes": 3, "refused": 1, "bytes_in": 10, "bytes_out": 20, "staleness": -1, "weight": 0.4,
           "budget": 0.5, "eta_s": 60.0, "spent": {"inner": 1.5, "mix": 0.1}, "partner_name": "gpu-2", "alone": None,
           "coalesced": False}
    assert scalars(row) == {
        "loss/train": 2.5, "throughput/tokens_per_s": 1e4, "time/utilization": 0.9, "inner/lr": 1e-3, "outer/lr": 0.7,
        "gossip/mixes": 3.0, "gossip/refused": 1.0, "gossip/bytes_in": 10.0, "gossip/bytes_out": 20.0,
        "gossip/staleness": -1.0, "gossip/weight": 0.4, "progress/budget": 0.5, "progress/eta_s": 60.0,
        "spent/inner_s": 1.5, "spent/mix_s": 0.1}
    assert texts(row) == {"gossip/partner": "gpu-2"}


def test_the_round_line_says_the_learning_rate_the_time_since_the_start_and_the_budget_spent():
    row = {"round": 3, "version": 3, "loss": 2.5, "tokens_per_s": 1000.0, "bytes_in": 2e6, "utilization": 0.9,
           "lr": 3e-4, "wall_s": 125.0, "budget": 0.25, "eta_s": 375.0}
    out = io.StringIO()
    progress_line("isle", row, "gpu-2", out)
    progress_line("isle", {**row, "budget": None, "eta_s": None, "loss": None}, "-", out)
    first, second = out.getvalue().splitlines()
    assert first.endswith("util 0.900 lr 3.00e-04 elapsed 2m05s done 25% eta 6m15s")
    assert second.endswith("lr 3.00e-04 elapsed 2m05s") and " loss - " in second


def test_the_record_carries_the_learning_rate_and_the_budget_and_older_records_still_read():
    record = IslandRecord(peer_id="a" * 20, endpoint="tcp://h:1", lr=1e-3, budget=0.5, eta_s=30.0)
    assert IslandRecord.from_dict(record.to_dict()) == record
    older = {k: v for k, v in record.to_dict().items() if k not in ("lr", "budget", "eta_s")}
    assert IslandRecord.from_dict(older).budget is None
    for bad in ({"budget": 1.5}, {"budget": -0.1}, {"lr": -1.0}, {"eta_s": float("nan")}):
        with pytest.raises(DiscoveryError):
            record.replace(**bad)
