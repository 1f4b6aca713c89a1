"""The parts of `bench gpu` that need no swarm: its shards, an island's figures, the memory rule (CUDA's branch too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2p_diloco.bench.gpu import PEAK_BF16_FLOPS, island_row, memory, mfu, peak_flops, write_data
from p2p_diloco.core.data import load_corpus
from p2p_diloco.core.device import peak_memory_bytes, reset_peak_memory
from p2p_diloco.core.shards import write_shard
from p2p_diloco.errors import DataError

pytestmark = pytest.mark.timeout(60)


def test_written_shards_are_read_back_with_their_vocabulary(tmp_path):
    folder = write_data(tmp_path / "data", 50257, max_bytes=2**20)
    corpus = load_corpus(folder)  # no --vocab-size: the header names it
    assert corpus.vocab_size == 50257
    text = load_corpus(max_bytes=2**20)
    assert torch.equal(corpus.train.window(0, 0, 5000), text.train[:5000].long())
    assert corpus.val.numel() == text.val.numel()


def test_write_shard_refuses_ids_outside_the_vocabulary(tmp_path):
    with pytest.raises(DataError, match=r"ids must lie in \[0, 100\)"):
        write_shard(tmp_path / "x.bin", np.array([1, 100]), 100)
    with pytest.raises(DataError):
        write_shard(tmp_path / "x.bin", np.array([1]), 0)


def summary(name: str, peak: int | None) -> dict:
    return {"name": name, "tokens": 3000, "rounds": 3, "utilization": 0.9, "initial_loss": 10.8, "eval_loss": 4.0,
            "mixes": 2, "failed_fetches": 0, "peak_device_bytes": peak, "publish_s": 0.5, "coalesced": 0,
            "spent": {"startup": 4.0, "inner": 5.0, "final": 1.0}}


def spent(inner: float, probe: float, other: float) -> dict:
    return {"inner": inner, "mix": 0.0, "probe": probe, "end": 0.0, "eval": 0.0, "checkpoint": 0.0, "other": other}


ROWS = [{"own_tokens": 1000, "wall_s": 5.0, "loss": 6.0, "spent": spent(0.5, 0.0, 4.5)},
        {"own_tokens": 2000, "wall_s": 6.0, "loss": 5.0, "spent": spent(0.9, 0.05, 0.05)},
        {"own_tokens": 3000, "wall_s": 7.0, "loss": 4.5, "spent": spent(0.95, 0.0, 0.05)}]


def test_an_islands_steady_figures_leave_the_first_round_out():
    row = island_row(summary("a", None), ROWS, params=10**6, peak=1e12)
    assert row["tokens_per_s"] == 1000.0  # 2000 tokens in 2 s after the first round (its 5 s carry the start)
    assert row["mfu"] == pytest.approx(6 * 10**6 * 1000.0 / 1e12)
    assert row["steady_utilization"] == pytest.approx(1.85 / 2.0)  # rounds 2 and 3, by their parts
    assert row["steady_spent_s"]["probe"] == 0.05 and (row["startup_s"], row["final_s"]) == (4.0, 1.0)
    assert (row["loss_start"], row["loss_end"], row["train_loss_end"], row["mixes"]) == (10.8, 4.0, 4.5, 2)
    one = island_row(summary("a", None), ROWS[:1], params=10**6, peak=None)
    assert one["tokens_per_s"] == 200.0 and one["mfu"] is None  # one round: all of it; no peak known


def test_mfu_takes_the_peak_of_the_devices_name_in_bf16_only():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12  # (the first part that matches)
    assert peak_flops("NVIDIA H200", "bf16") == dict(PEAK_BF16_FLOPS)["H200"]
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") is None and peak_flops("x86_64", "bf16") is None
    assert mfu(124_000_000, 400_000.0, 989e12) == pytest.approx(0.3009, abs=1e-4) and mfu(1, None, 1e12) is None


def test_memory_is_the_islands_cuda_peak_or_else_bench_rounds():
    rows = [island_row(summary("a", 3 * 2**30), ROWS, 1, None), island_row(summary("b", 5 * 2**30), ROWS, 1, None)]
    m = memory(rows, {"peak_extra_bytes": 123}, params=2**26)
    assert m["model_optimizer_bytes"] == 2**30 and m["peak_bytes"] == 5 * 2**30 and m["peak_vs_model_optimizer"] == 5
    assert "max_memory_allocated" in m["method"]
    cpu = memory([island_row(summary("a", None), ROWS, 1, None)], {"peak_extra_bytes": 123}, params=2**26)
    assert cpu["peak_bytes"] == 123 and "bench round" in cpu["method"]


def test_torch_keeps_no_peak_off_cuda():
    assert reset_peak_memory(torch.device("cpu")) is None and peak_memory_bytes(torch.device("cpu")) is None
