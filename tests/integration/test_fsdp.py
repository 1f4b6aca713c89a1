"""Sharded islands: two torchrun islands of 2 processes each, the model sharded with FSDP2 (gloo on
the CPU), train, mix each other's state, and one resumes from its checkpoint (`peers.torchrun.sharding`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from swarm_harness import SMALL_MODEL, IslandProc, start_bootstrap

from p2p_diloco.config import ModelConfig
from p2p_diloco.core.model import build_model

pytestmark = pytest.mark.timeout(150)

ROUNDS = 3
FULL_PARAMS = build_model(ModelConfig(**SMALL_MODEL), 256).num_params()
"""The islands' GPT's parameters (over bytes)."""


def test_sharded_islands_mix_and_resume(procs, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    launcher = [str(torchrun), "--standalone", "--nproc-per-node", "2"]
    _, entry = start_bootstrap(procs, tmp_path)
    islands = [IslandProc(procs, tmp_path, f"fsdp{k}", entry, "-H", "8", "--max-rounds", str(ROUNDS), "--shard", "fsdp",
                          "--wait-for", "2", launcher=launcher, every=1) for k in range(2)]
    summaries = [isl.summary(110) for isl in islands]
    ids = [s["peer_id"] for s in summaries]
    for isl, s, other in zip(islands, summaries, reversed(ids)):
        assert s["rounds"] == ROUNDS and s["version"] >= ROUNDS, s
        assert s["shard"] == "fsdp" and s["rank_params"] < 0.6 * FULL_PARAMS, s  # rank 0 trained a shard
        assert s["tokens"] == 2 * 8 * 64 * sum(r["steps"] for r in isl.rounds()), s  # two ranks: twice a step's tokens
        assert s["eval_loss"] < s["initial_loss"] - 0.3, s  # the sharded model learned (ln 256 = 5.55 at the start)
        mixed = [r for r in isl.rounds() if r.get("partner") == other and r.get("weight")]
        assert mixed or s["mixes"] >= 1, (s, isl.rounds())  # mixed the other sharded island's state
    # one island comes back from its checkpoint and carries on (alone: the other has left)
    first = islands[0]
    saved = summaries[0]["version"]
    again = IslandProc(procs, tmp_path, "fsdp0", entry, "-H", "8", "--max-rounds", str(ROUNDS + 1), "--shard", "fsdp",
                       "--resume", launcher=launcher, run_dir=first.run_dir, every=1)
    s = again.summary(60)
    rows = first.rounds()
    assert s["rounds"] == ROUNDS + 1 and s["version"] == saved + 1, (s, again.tail())  # the round and version carried on
    assert rows[-1]["round"] == ROUNDS + 1 and rows[-1]["version"] == saved + 1, rows[-2:]
    # its first evaluation already saw the trained state (a fresh model's loss is ln 256 = 5.55)
    assert s["initial_loss"] < summaries[0]["initial_loss"] - 0.3 and s["eval_loss"] < s["initial_loss"] + 0.1, s
