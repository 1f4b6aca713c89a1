"""`p2p_diloco.join`: make a user's model and inner optimizer an island of a swarm.

The one entry point of the Python API (exported lazily as `p2p_diloco.join`, so `import
p2p_diloco` stays light). It builds the configs from a few common keywords, puts the model on its
device, and returns a `SwarmIsland` (`peers.island`) on a plain process or on rank 0 of a torchrun
island, or a `RankFollower` (`peers.torchrun.distributed`) on the other ranks: the loop is the same on all.
A model the caller sharded with FSDP2's `fully_shard` makes a sharded island (`peers.torchrun.sharding`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, NetworkConfig
from p2p_diloco.core.device import resolve_device
from p2p_diloco.peers.torchrun.distributed import IntraIsland, RankFollower
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.island import SwarmIsland
from p2p_diloco.peers.parts import IslandParts
from p2p_diloco.tracking import LogConfig
from p2p_diloco.peers.torchrun.sharding import gather_on_read, is_sharded, rank0_parts, shard_island


def join(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, *,
         bootstrap: str | list[str] | tuple[str, ...] | None = None, run_id: str | None = None,
         secret: str | None = None, run_dir: str | Path | None = None, device: str | None = None,
         diloco: DiLoCoConfig | None = None, network: NetworkConfig | None = None,
         discovery: DiscoveryConfig | None = None, island: IslandConfig | None = None,
         eval_fn: Any = None, extra_state: Any = None, tokens_per_step: int = 1,
         probe_fn: Any = None, full_model: torch.nn.Module | None = None,
         log: LogConfig | None = None) -> SwarmIsland | RankFollower:
    """An island around `model` and `optimizer`; use it as a context manager and call `step()` after
    each `optimizer.step()`.

    - `bootstrap`, `run_id`, `secret`, `run_dir`: the common settings, applied over the config
      objects (`discovery`, `island`) when both are given. The swarm secret
      (`DiscoveryConfig.secret`) guards both the state exchange and discovery (docs/SECURITY.md).
    - `device`: `auto|cpu|cuda|cuda:N|mps` moves the model (and the optimizer's state) there;
      None leaves it where it is. The outer state lives with the model unless
      `DiLoCoConfig.offload_outer`.
    - `scheduler`, `extra_state` (anything with `state_dict()` / `load_state_dict()`, e.g. a data
      loader's position): checkpointed and resumed with the island.
    - `eval_fn() -> float`: a held-out loss, evaluated at the start, every `eval_every` rounds and
      at the end, shown by `status` and the dashboard.
    - `probe_fn() -> float`: the model's loss over a few fixed held-out batches other than
      `eval_fn`'s; with it, a partner's state is mixed only when its mix does not raise that loss
      (`peers.admission.probe`: it catches stuck, replayed and reversed training that distance bounds miss).
    - `tokens_per_step`: tokens of one inner step on this process when `step()` is not told.
    - `log`: where each round's figures go besides `run_dir/metrics.jsonl` (`LogConfig(to=("tensorboard",
      "wandb"))`; each tracker's package must be installed: `p2p_diloco.tracking`).
    - A `run_dir` that holds an earlier run's checkpoints is resumed (`IslandConfig(resume=True)`) or
      moved aside (`fresh=True`), never overwritten: without either it is a `ConfigError`
      (`peers.state.rundir.RunDirError`), as `resume` is where there is no checkpoint.
    - Under torchrun, wrap the model in DDP, or shard it with `fully_shard` (FSDP2: the root module
      too) and build the optimizer after, as usual. A sharded island's rank 0 keeps a full-size copy
      of the weights for the swarm: `full_model` (same architecture, unsharded, given on rank 0)
      if given, else a parameter-only mirror. `eval_fn` runs on rank 0 alone, so there it must
      evaluate that copy, `island.model`, which needs `full_model`: the sharded model would wait
      for the other ranks.
    """
    discovery = _replace(discovery or DiscoveryConfig(), bootstrap=_tuple(bootstrap), run_id=run_id, secret=secret)
    island = _replace(island or IslandConfig(), run_dir=Path(run_dir) if run_dir is not None else None)
    if device is not None:
        _move(model, optimizer, resolve_device(device))
    group, sharded = IntraIsland.current(), is_sharded(model)
    if sharded and group is None:
        raise ConfigError("a model sharded with fully_shard needs a torchrun island of 2 processes or more")
    if full_model is not None and not sharded:
        raise ConfigError("full_model is rank 0's copy of a sharded model's weights: shard the model with fully_shard")
    full = shard_island(group, model, full_model) if sharded else None
    if group is not None and group.rank > 0:
        return RankFollower(model, group)
    whole, inner = rank0_parts(model, optimizer, full)
    out = SwarmIsland(whole, inner, scheduler, diloco=diloco, network=network, discovery=discovery, island=island,
                      eval_fn=eval_fn, extra_state=extra_state, tokens_per_step=tokens_per_step, group=group,
                      probe_fn=probe_fn, parts=IslandParts(log=log or LogConfig()))
    if full is not None:
        gather_on_read(out.outer, group, full)
    return out


def _tuple(bootstrap: Any) -> tuple[str, ...] | None:
    if bootstrap is None:
        return None
    return (bootstrap,) if isinstance(bootstrap, str) else tuple(bootstrap)


def _replace(cfg: Any, **changes: Any) -> Any:
    """`cfg` with the changes that are not None (validated again by the config's own checks)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _move(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move the model, in place, and any optimizer state already made, to `device`."""
    model.to(device)
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                state[k] = v.to(device)
