"""Nothing lost on a second start (`peers/state/rundir.py`): a run directory that holds checkpoints is
resumed or moved aside, never overwritten; `--resume` without a checkpoint and run directories that
cannot be used are one line and exit code 2, before the island starts."""

from __future__ import annotations

import os
import time

import pytest
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.config import IslandConfig
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.state.rundir import (
    PREVIOUS, RunDirError, check_run_dir, holds_checkpoints, move_aside, prepare_run_dir
)

pytestmark = pytest.mark.timeout(60)


def earlier_run(run_dir):
    """A run directory as an island leaves it: checkpoints, metrics, its island.json and a tracker's files."""
    ckpt = run_dir / "checkpoints" / "ckpt-00000003-00000003"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text('{"round": 3}')
    (run_dir / "checkpoints" / "latest").write_text(ckpt.name)
    (run_dir / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"round": 3}\n')
    (run_dir / "island.json").write_text('{"peer_id": "old"}')
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "events.out.tfevents.1").write_bytes(b"old events")
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def joined(monkeypatch):
    """`join` on the command line with a stand-in for the island process: what it was given, if it ran."""
    seen = {}

    def fake_run_island(island, model, train, diloco, network, discovery, data, vocab_size=None, parts=None):
        seen["island"] = island
        return 0, {}

    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island", fake_run_island)

    def run(*args):
        r = CliRunner().invoke(main, ["join", "--device", "cpu", *args])
        return r, seen.pop("island", None)

    return run


def one_line_exit_2(r):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


# -- the run directory's own checks ------------------------------------------------------------------
def test_a_directory_with_checkpoints_is_resumed_or_moved_aside_never_started_over(tmp_path):
    before = earlier_run(tmp_path)
    assert holds_checkpoints(tmp_path)
    with pytest.raises(RunDirError, match="holds the checkpoints of an earlier run: continue it with --resume") as e:
        check_run_dir(tmp_path, resume=False)
    assert "--fresh" in str(e.value) and "\n" not in str(e.value)
    assert check_run_dir(tmp_path, resume=True) == tmp_path and files(tmp_path) == before
    moved = prepare_run_dir(tmp_path, resume=False, fresh=True)
    assert moved.parent == tmp_path and moved.name.startswith(PREVIOUS)
    assert files(moved) == before  # every file, as it was: renamed, nothing deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == [moved.name] and not holds_checkpoints(tmp_path)
    check_run_dir(tmp_path, resume=False)  # a clean directory now


def test_a_second_fresh_start_in_the_same_second_keeps_both_earlier_runs(tmp_path):
    earlier_run(tmp_path)
    first = move_aside(tmp_path)
    earlier_run(tmp_path)
    second = move_aside(tmp_path)
    assert first != second and holds_checkpoints(first) and holds_checkpoints(second)
    assert move_aside(tmp_path) is None  # nothing left to move


def test_resume_without_a_checkpoint_fails_at_once(tmp_path):
    for run_dir in (tmp_path / "never-made", tmp_path):
        with pytest.raises(RunDirError, match="nothing to resume: .* holds no checkpoint"):
            check_run_dir(run_dir, resume=True)
    assert not (tmp_path / "never-made").exists()  # a check makes nothing


def test_paths_that_cannot_be_a_run_directory_are_one_line(tmp_path):
    afile = tmp_path / "somefile"
    afile.write_text("keep me")
    for run_dir, message in ((afile / "run", "would be made under .*somefile, which is a file"),
                             (afile, "is a file"), (tmp_path / ("x" * 300), "cannot be used: File name too long")):
        with pytest.raises(RunDirError, match=message) as e:
            check_run_dir(run_dir, resume=False)
        assert "\n" not in str(e.value)
    assert afile.read_text() == "keep me"


def test_a_directory_this_user_cannot_write_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("p2p_diloco.peers.state.rundir.os.access", lambda path, mode: False)  # (root may write anywhere)
    with pytest.raises(RunDirError, match="may not write there"):
        check_run_dir(tmp_path, resume=False)
    with pytest.raises(RunDirError, match=r"cannot be made in .*: this user may not write there"):
        check_run_dir(tmp_path / "new", resume=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in a folder whatever its mode")
def test_a_read_only_directory_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(RunDirError, match="may not write there"):
            check_run_dir(tmp_path / "run", resume=False)
    finally:
        tmp_path.chmod(0o700)


def test_resume_and_fresh_together_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="island.fresh"):
        IslandConfig(run_dir=tmp_path, resume=True, fresh=True)


# -- join on the command line: before the island starts ---------------------------------------------
def test_join_refuses_an_earlier_runs_directory_and_overwrites_nothing(tmp_path, joined):
    before = earlier_run(tmp_path)
    r, island = joined("--run-dir", str(tmp_path))
    one_line_exit_2(r)
    assert "--resume" in r.output and "--fresh" in r.output and island is None
    assert files(tmp_path) == before
    r, island = joined("--run-dir", str(tmp_path), "--resume")
    assert r.exit_code == 0 and island.resume
    r, island = joined("--run-dir", str(tmp_path), "--fresh")  # (the island moves it aside, under its lock)
    assert r.exit_code == 0 and island.fresh and files(tmp_path) == before


@pytest.mark.parametrize("args, message", [
    (["--resume"], "nothing to resume"),
    (["--resume", "--fresh"], "island.fresh"),
])
def test_join_resume_without_a_checkpoint_fails_before_the_island_starts(tmp_path, joined, args, message):
    t0 = time.monotonic()
    r, island = joined("--run-dir", str(tmp_path / "run"), *args)
    one_line_exit_2(r)
    assert message in r.output and island is None and time.monotonic() - t0 < 5


def test_join_in_a_directory_it_cannot_use_is_one_line(tmp_path, joined):
    afile = tmp_path / "somefile"
    afile.write_text("keep me")
    for run_dir in (afile / "run", tmp_path / ("x" * 300)):
        r, island = joined("--run-dir", str(run_dir))
        one_line_exit_2(r)
        assert "run directory" in r.output and island is None
    assert afile.read_text() == "keep me"


# -- the Python API: the same protection --------------------------------------------------------------
def test_the_api_never_overwrites_an_earlier_run(tmp_path):
    torch = pytest.importorskip("torch")
    from test_api import Tiny, lone_island

    def one_round(island):
        with island:
            while not island.done:
                island.step(loss=1.0)

    model = Tiny()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    one_round(lone_island(tmp_path, model, opt, max_rounds=1))
    before = files(tmp_path / "checkpoints")
    t0 = time.monotonic()
    with pytest.raises(RunDirError, match="holds the checkpoints of an earlier run"):
        lone_island(tmp_path, model, opt, max_rounds=1)
    with pytest.raises(RunDirError, match="nothing to resume"):
        lone_island(tmp_path / "other", model, opt, resume=True)
    assert time.monotonic() - t0 < 2  # refused before discovery starts
    assert files(tmp_path / "checkpoints") == before
    one_round(lone_island(tmp_path, model, opt, max_rounds=1, fresh=True))  # (the refusals freed the directory)
    [previous] = tmp_path.glob(f"{PREVIOUS}*")
    assert files(previous / "checkpoints") == before and (previous / "metrics.jsonl").exists()
    assert holds_checkpoints(tmp_path) and len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 1
