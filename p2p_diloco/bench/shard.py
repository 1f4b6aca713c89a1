"""`p2p-diloco bench shard`: memory per rank of a torchrun island, its model replicated (DDP) or
sharded (FSDP2), for the same model in one run.

For each way, `torchrun --standalone --nproc-per-node N` starts N processes of this module
(`python -m p2p_diloco.bench.shard WAY PRESET STEPS ROUNDS BATCH`), gloo on the CPU. Each rank
builds what `p2p-diloco join` builds (`peers.launch.process`): the GPT from the preset over bytes, wrapped
by the strategy (`peers.torchrun.sharding`), its AdamW (`core.inner.InnerLoop`), and on rank 0 the outer
state (`core.island.OuterLoop`: anchor and momentum) over the model, or over its full copy when
sharded. Then `ROUNDS` rounds of `STEPS` inner steps on random tokens, each ended as an island ends
it: rank 0 reads the weights (gathered from the ranks when sharded), takes the outer step, and
every rank takes the new anchor (`NEW_ROUND`). No networking: the exchange's memory is the same
both ways (`bench round` measures it).

Each rank reports the bytes it holds: parameters, gradients and optimizer state (its shards' when
sharded), rank 0's outer state and full copy, and their sum (`held_bytes`); its RSS's peak above
the RSS after `import torch` while it built everything (`setup_peak_bytes`: every rank builds the
model whole before sharding it, as `join` does, so islands of one run start from the same weights)
and while it trained and ended rounds (`train_peak_bytes`: activations, FSDP's gathered blocks and
buffers included), both from the kernel's VmHWM reset between them (`bench round`'s `PeakMeter`);
the process's `ru_maxrss`; the median inner step; and the median round's end (`round_end_s`: on
rank 0 the gather when sharded, the outer step, and the new anchor sent to every rank).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

WAYS = ("replicate", "fsdp")


def _bytes(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def worker(way: str, preset: str, steps: int, rounds: int, batch: int) -> None:
    """One rank of one way: build, train, end rounds, report (rank 0 prints every rank's row)."""
    import torch
    import torch.distributed as dist

    from p2p_diloco.bench.memory import PeakMeter
    from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
    from p2p_diloco.core.inner import InnerLoop
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.core.model import build_model
    from p2p_diloco.peers.torchrun.distributed import NEW_ROUND, IntraIsland, RankFollower
    from p2p_diloco.peers.torchrun.sharding import gather_on_read, local_numel, sharding

    torch.set_num_threads(1)
    meter = PeakMeter()  # the RSS after `import torch` is its baseline
    group = IntraIsland.init_from_env(torch.device("cpu"))
    strategy = sharding(way, group.world)
    cfg = ModelConfig(size=preset)
    torch.manual_seed(0)
    model = strategy.wrap(build_model(cfg, 256), group)
    inner = InnerLoop(model, TrainConfig(batch_size=batch, warmup_steps=0))
    full = strategy.full_copy(group, model, lambda: build_model(cfg, 256))
    outer = follower = None
    if group.rank == 0:
        outer = OuterLoop("bench", model if full is None else full, DiLoCoConfig(local_steps=steps))
        gather_on_read(outer, group, full)
    else:
        follower = RankFollower(model, group)
    block = cfg.resolved()["block_size"]
    setup_peak = meter.take()  # building the model whole (every rank), sharding it, rank 0's copy and outer state
    gen = torch.Generator().manual_seed(group.rank)
    times, ends = [], []
    for _ in range(rounds):
        for _ in range(steps):
            x = torch.randint(0, 256, (batch, block + 1), generator=gen)
            t0 = time.perf_counter()
            inner.train_step(x[:, :-1], x[:, 1:])
            times.append(time.perf_counter() - t0)
            if outer is not None:  # an inner step that changes nothing: CARRY_ON
                group.send(0)
            else:
                follower.step()
        t0 = time.perf_counter()
        if outer is not None:  # the round's end: read the weights, outer step, every rank takes the anchor
            outer.end_round([], tokens=steps * batch * block)
            group.send(NEW_ROUND)
            group.sync_weights(outer.slices.params)
        else:
            follower.step()
        ends.append(time.perf_counter() - t0)
    params = list(model.parameters())
    row = {"way": way, "rank": group.rank, "params": local_numel(model), "param_bytes": _bytes(params),
           "grad_bytes": _bytes(p.grad for p in params if p.grad is not None),
           "optimizer_bytes": _bytes(v for s in inner.optimizer.state.values() for v in s.values()
                                     if isinstance(v, torch.Tensor) and v.dim() > 0),
           "outer_bytes": 0 if outer is None else _bytes([outer.state.phi, outer.state.m]),
           "full_copy_bytes": 0 if full is None else _bytes(full.parameters()),
           "setup_peak_bytes": setup_peak, "train_peak_bytes": meter.take(), "meter": meter.method,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_s": statistics.median(times), "round_end_s": statistics.median(ends)}
    row["held_bytes"] = sum(row[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "outer_bytes",
                                             "full_copy_bytes"))
    rows = [None] * group.world
    dist.all_gather_object(rows, row)
    if group.rank == 0:
        print(json.dumps({"way": way, "preset": preset, "world": group.world, "total_params": model_params(cfg),
                          "rows": rows}), flush=True)
    group.close()


def model_params(cfg) -> int:
    from p2p_diloco.core.model import build_model

    return build_model(cfg, 256).num_params()


def run_shard(preset: str, ranks: int, steps: int, rounds: int, batch: int,
              log: Callable[[str], None] = lambda _m: None) -> dict:
    """Both ways, one after the other, each under its own torchrun: {way: its report}."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        raise RuntimeError(f"torchrun is not installed beside {sys.executable}")
    out = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for way in WAYS:
        log(f"{way}: {ranks} ranks, preset {preset}, {rounds} rounds of {steps} steps")
        cmd = [str(torchrun), "--standalone", "--nproc-per-node", str(ranks), "-m", "p2p_diloco.bench.shard",
               way, preset, str(steps), str(rounds), str(batch)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{way} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        out[way] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


if __name__ == "__main__":
    way_, preset_, steps_, rounds_, batch_ = sys.argv[1:6]
    worker(way_, preset_, int(steps_), int(rounds_), int(batch_))
