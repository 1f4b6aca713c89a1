"""`p2p-diloco bench swarm` end to end: the demo's island processes, repeated runs, the simulations."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.timeout(300)


def test_bench_swarm_repeats_the_swarm_and_averages_its_runs(procs, tmp_path):
    # 2 islands x 2 rounds of 5 steps per run: small enough for CI, the same code path as the benchmark
    proc = procs.python("-m", "p2p_diloco", "bench", "swarm", "--islands", "2", "--tokens", "40960", "-H", "5",
                        "--runs", "2", "--workdir", str(tmp_path), "--json", stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["runs"] == 2 and len(out["per_run"]) == 2 and out["tokens"] == 40960
    for k, run in enumerate(out["per_run"]):
        assert run["workdir"] == str(tmp_path / f"run-{k}")
        assert run["tokens_per_island"] == [20480, 20480]
        assert all(loss < 5.0 for loss in run["per_island_eval_loss"]), run  # 5.35 at the start
        assert all(0.5 < u <= 1.0 for u in run["utilization"]), run
        assert run["step_seconds"] > 0
    mean = sum(r["swarm_eval_loss"] for r in out["per_run"]) / 2
    assert out["swarm_eval_loss"] == pytest.approx(mean)
    assert out["ratio_to_dp"] == pytest.approx(mean / out["dp_eval_loss"])
    assert out["ratio_to_sim_gossip"] == pytest.approx(mean / out["sim_gossip_eval_loss"])
