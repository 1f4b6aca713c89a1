"""Sharded islands (`peers.torchrun.sharding`): the setting's checks, and, in two gloo processes, rank 0's full
copy gathered from the shards when it reads them and scattered back when it changes them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from p2p_diloco.config import SHARDS, TrainConfig
from p2p_diloco.core.params import fingerprint
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.torchrun.distributed import SYNC, IntraIsland, RankFollower
from p2p_diloco.peers.torchrun.sharding import SHARDINGS, FullyShard, GatheredSlices, Replicate, shard_island, sharding

pytestmark = pytest.mark.timeout(60)


def test_a_shard_needs_torchrun():
    assert tuple(SHARDINGS) == SHARDS  # every name the config accepts builds a strategy
    assert isinstance(sharding("replicate", 1), Replicate) and isinstance(sharding("fsdp", 2), FullyShard)
    with pytest.raises(ConfigError, match="torchrun"):
        sharding("fsdp", 1)
    with pytest.raises(ConfigError, match="train.shard must be one of"):
        TrainConfig(shard="zero3")


def test_join_with_a_shard_but_no_torchrun_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, "-m", "p2p_diloco", "join", "--shard", "fsdp", "--run-dir", str(tmp_path),
                          "--max-rounds", "1"], capture_output=True, text=True, timeout=50, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("Error: train.shard 'fsdp' shards the model"), out.stderr


class _Tiny(torch.nn.Module):
    """Blocks in a `ModuleList` (each its own FSDP unit) and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(2))
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight


def _model() -> torch.nn.Module:
    return _Tiny()


def _two_ranks(rank: int, port: int, errors) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        group = IntraIsland()
        torch.manual_seed(0)
        model = FullyShard().wrap(_model(), group)
        torch.manual_seed(0)
        plain = _model()
        full = shard_island(group, model, None)  # rank 0: a mirror of the sharded model
        params = [p for p in model.parameters()]
        if rank == 0:
            assert fingerprint(full) == fingerprint(plain)  # the swarm sees the same model
            for p, q in zip(full.parameters(), plain.parameters()):
                assert torch.equal(p, q)  # gathered whole at the start
            slices = GatheredSlices(full, group)
            group.send(0)  # CARRY_ON: the ranks train on ...
        else:
            follower = RankFollower(model, group)
            follower._follow()
        with torch.no_grad():  # ... an inner step moves every rank's shard
            for p in params:
                p.to_local().add_(1.0)
        if rank == 0:
            vec = slices.gather()  # reading the weights gathers them first (GATHER)
            assert torch.allclose(vec, torch.cat([q.detach().flatten() + 1 for q in plain.parameters()]))
            slices.load(vec * 2)  # rank 0 changes them (a mix) ...
            group.send(SYNC)
            group.sync_weights(slices.params)
        else:
            follower._follow()
        for p, q in zip(params, plain.parameters()):  # ... and every rank's shard took them
            assert torch.allclose(p.full_tensor(), (q.detach() + 1) * 2)
        dist.barrier()  # (the ranks leave together: a rank that tears gloo down while the other still talks aborts)
        dist.destroy_process_group()
    except BaseException as e:  # report to the parent: an assert in a child would only show as an exit code
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
        raise
    os._exit(0)  # (not the interpreter's finalization, as `peers.torchrun.distributed.exit_process`: gloo aborted it)


def test_rank_0_gathers_on_read_and_scatters_what_it_changed():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_two_ranks, args=(r, port, errors)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(50)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures and all(p.exitcode == 0 for p in procs), (failures, [p.exitcode for p in procs])
