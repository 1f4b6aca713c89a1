"""`p2p-diloco bench gpu` on the CPU with the tiny model: the GPU check's code path, kept working in CI.

The same command `scripts/gpu_check.sh` runs on a GPU machine: a bootstrap node and two island
processes on token shards it writes itself, then `bench round` in a fresh process, one JSON object.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from p2p_diloco.bench.round import shape_params
from p2p_diloco.config import ModelConfig
from p2p_diloco.core.shards import open_shard

pytestmark = pytest.mark.timeout(240)


def test_bench_gpu_runs_on_the_cpu_and_reports_every_figure(procs, tmp_path):
    out_file = tmp_path / "gpu_check.json"
    proc = procs.python("-m", "p2p_diloco", "bench", "gpu", "--device", "cpu", "--preset", "tiny", "--vocab-size", "256",
                        "--rounds", "4", "-H", "4", "--batch-size", "4", "--plain-steps", "3", "--big-preset", "none",
                        "--workdir", str(tmp_path / "run"),
                        "--output", str(out_file), "--json", stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0
    out = json.loads(stdout.strip())  # one JSON object on stdout, progress on stderr
    assert json.loads(out_file.read_text()) == out
    params = shape_params({**ModelConfig(size="tiny").resolved(), "vocab_size": 256})
    assert (out["device"], out["preset"], out["params"], out["precision"]) == ("cpu", "tiny", params, "bf16")
    # the shards it trained on: the embedded corpus's bytes, under the vocabulary it names in their header
    tokens, vocab = open_shard(tmp_path / "run" / "data" / "train.bin")
    assert vocab == 256 and len(tokens) > 100_000 and int(tokens.max()) < 256
    assert len(out["islands"]) == 2
    for island in out["islands"]:
        # the token budget exactly; a round may be stretched while the partner is behind (DESIGN, `max_stretch`)
        assert island["tokens"] == 4 * 4 * 4 * 128 and 1 <= island["rounds"] <= 4, island
        assert island["tokens_per_s"] > 0, island
        assert math.isfinite(island["loss_start"]) and math.isfinite(island["loss_end"]), island
        assert island["loss_end"] < island["loss_start"] < 5.6, island  # ln(256) = 5.55 at the start
        assert island["peak_device_bytes"] is None  # no CUDA: torch keeps no count on the CPU
        assert island["mfu"] is None  # no peak known for a CPU
        spent = island["steady_spent_s"]  # rounds 2 on, by part; start-up apart
        assert set(spent) == {"inner", "mix", "probe", "end", "eval", "checkpoint", "other"} and spent["inner"] > 0, island
        assert island["steady_utilization"] == pytest.approx(spent["inner"] / sum(spent.values()), abs=5e-3)  # (ms)
        assert island["startup_s"] > 0 and island["publish_s"] > 0 and island["coalesced"] >= 0, island
    # the islands met: on a loaded machine one may start its first round after the other's last (the
    # suite's first minutes), and then only the first one fetches, once or twice: its state may be refused
    # (the gate's start bound) and its final mix may find the other gone (seen once: 0 mixes, 1 failed fetch)
    assert all(island["mixes"] >= 0 and island["failed_fetches"] >= 0 for island in out["islands"])
    assert sum(island["mixes"] + island["failed_fetches"] for island in out["islands"]) >= 1, out["islands"]
    plain = out["plain"]  # the baseline: the same model and batch, no swarm
    assert plain["steps"] == 3 and plain["tokens_per_s"] > 0 and math.isfinite(plain["loss_last"]), plain
    together = sum(island["tokens_per_s"] for island in out["islands"])
    assert out["islands_vs_plain"] == pytest.approx(together / plain["tokens_per_s"])
    # no second pair (`--big-preset none`): on a GPU it is the first pair's code at another size, which
    # CI has just run; here it would only start a second swarm
    assert out["big"] is None
    r = out["round"]
    assert r["device"] == "cpu" and r["overhead_s"] > 0 and r["clone_s"] > 0
    assert r["overhead_vs_clone"] == pytest.approx(r["overhead_s"] / r["clone_s"])
    m = out["memory"]  # on the CPU: what `bench round` reports
    assert m["model_optimizer_bytes"] == 16 * params and m["peak_bytes"] == r["peak_extra_bytes"] > 0
    assert m["peak_vs_model_optimizer"] == pytest.approx(m["peak_bytes"] / m["model_optimizer_bytes"])


def test_bench_gpu_without_cuda_is_one_line(procs):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the error of a machine without CUDA")
    proc = procs.python("-m", "p2p_diloco", "bench", "gpu", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and stderr.strip().startswith("Error: --device cuda: CUDA is not available here")
