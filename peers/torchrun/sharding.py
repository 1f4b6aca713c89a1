"""Sharded islands: FSDP2 (`fully_shard`) inside a torchrun island instead of DDP.

With DDP every rank of an island holds the whole model, its gradients and its inner optimizer's
state. With FSDP2 each rank holds one shard of each parameter (a `DTensor`), of its gradient and
of the optimizer's moments, and the weights are gathered layer by layer for the forward and
backward passes. What travels between islands does not change: rank 0 keeps a full-size copy of
the weights (`full_model`, a plain module of the same architecture, or a parameter-only mirror),
and that copy is what its `SwarmIsland` works on (anchor, outer step, mixing, exchange,
checkpoints, evaluation), so a sharded island mixes with replicated and single-process ones.

The copy is kept up to date lazily (`ShardedWeights`, `GatheredSlices`): the first time rank 0
reads the weights after the ranks trained (a round's end, a mix on arrival), it sends `GATHER`
and every rank all-gathers each parameter into it (`DTensor.full_tensor`); when rank 0 changes
them (`SYNC`, `NEW_ROUND`, `STOP`), each rank takes its shard of the copy (`distribute_tensor`,
a scatter from rank 0). Between two reads nothing moves but FSDP's own traffic.

Under FSDP the checkpoint keeps the outer state, the scheduler, the buffers, the caller's state
and the inner optimizer's hyper-parameters; the inner optimizer's moments, spread over the ranks,
start afresh on resume (as after a divergence's roll-back).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn

from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.params import ParamSlices, named_trainable
from p2p_diloco.errors import ConfigError, ModelError
from p2p_diloco.peers.torchrun.distributed import IntraIsland

log = logging.getLogger(__name__)


class Replicate:
    """Every rank holds the whole model; DDP averages the gradients (the default)."""

    shards = False

    def wrap(self, model: nn.Module, group: IntraIsland) -> nn.Module:
        return group.wrap(model)

    def full_copy(self, group: IntraIsland, model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module | None:
        """None: rank 0 works on the model itself."""
        return None


class FullyShard:
    """Each rank holds a shard of every parameter (FSDP2): each block of every `nn.ModuleList` is a
    unit of its own (gathered for its forward and backward, freed after), the rest the root's."""

    shards = True

    def wrap(self, model: nn.Module, group: IntraIsland) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        for module in list(model.modules()):
            if isinstance(module, nn.ModuleList):
                for block in module:
                    fully_shard(block)
        fully_shard(model)
        return model

    def full_copy(self, group: IntraIsland, model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module | None:
        """Every rank: `shard_island` with `build()` as rank 0's full copy (None on the other ranks)."""
        return shard_island(group, model, build() if group.rank == 0 else None)


SHARDINGS: dict[str, type[Replicate] | type[FullyShard]] = {"replicate": Replicate, "fsdp": FullyShard}
"""`TrainConfig.shard`'s values (`p2p_diloco.choices.SHARDS`) and what each builds."""


def sharding(name: str, world: int) -> Replicate | FullyShard:
    """The strategy `name` names; `ConfigError` when it shards a model over fewer than 2 processes."""
    strategy = SHARDINGS[name]()
    if strategy.shards and world <= 1:
        raise ConfigError(f"train.shard {name!r} shards the model over the processes of a torchrun island: "
                          "start join under `torchrun --nproc-per-node N` (N >= 2), or leave --shard at replicate")
    return strategy


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are DTensors (it went through `fully_shard`)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def local_numel(model: nn.Module) -> int:
    """Values of `model`'s parameters this process holds (its shards' under FSDP, all under DDP)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())


class ShardedWeights:
    """The trainable parameters of a sharded model (a shard on each rank) and, on rank 0, the
    full-size copy its island works on (the `peers.torchrun.distributed.RankWeights` of a sharded island)."""

    def __init__(self, model: nn.Module, full_model: nn.Module | None) -> None:
        from torch.distributed.tensor import DTensor

        self.shards = named_trainable(model)
        plain = [name for name, p in self.shards if not isinstance(p, DTensor)]
        if plain:
            raise ModelError(f"parameter {plain[0]!r} is not sharded: apply fully_shard to the root module too")
        self.full: list[torch.Tensor] | None = None
        if full_model is not None:
            own = dict(named_trainable(full_model))
            odd = [n for n, p in self.shards if n not in own or own[n].shape != p.shape]
            if odd or len(own) != len(self.shards):
                raise ModelError(f"full_model's trainable parameters are not the sharded model's (names, shapes): "
                                 f"{(odd or sorted(set(own) - {n for n, _ in self.shards}))[:3]}")
            self.full = [own[name] for name, _ in self.shards]
        self.stale = False

    @torch.no_grad()
    def pull(self) -> None:
        """Every rank: each parameter gathered whole (an all-gather), kept by rank 0."""
        for i, (_, p) in enumerate(self.shards):
            whole = p.full_tensor()
            if self.full is not None:
                self.full[i].copy_(whole)
        self.stale = False

    @torch.no_grad()
    def push(self, params: list[torch.Tensor]) -> None:
        """Every rank: its shard of rank 0's full copy (a scatter from rank 0; `params` is unused: the
        full copy on rank 0 and this rank's shards are known)."""
        from torch.distributed.tensor import distribute_tensor

        for i, (_, p) in enumerate(self.shards):
            src = self.full[i] if self.full is not None else torch.empty(p.shape, dtype=p.dtype,
                                                                         device=p.to_local().device)
            p.to_local().copy_(distribute_tensor(src.detach(), p.device_mesh, p.placements).to_local())

    def trained(self) -> None:
        self.stale = True


class GatheredSlices(ParamSlices):
    """Rank 0's `ParamSlices` over its full copy, gathered from the ranks before it is read whenever
    they trained since (`IntraIsland.refresh`)."""

    def __init__(self, full_model: nn.Module, group: IntraIsland) -> None:
        super().__init__(full_model)
        self.group = group

    def __iter__(self):
        self.group.refresh()
        return super().__iter__()


class InnerHyperParams:
    """Rank 0's inner optimizer as a sharded island checkpoints and rolls it back: its param groups
    (learning rate, the roll-backs' cut), not its moments, which are DTensors spread over the ranks."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        return {"state": {}, "param_groups": self.optimizer.state_dict()["param_groups"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def mirror(model: nn.Module) -> nn.Module:
    """A parameter-only module with `model`'s trainable parameters' names and full shapes (and its
    buffers): the full copy rank 0 keeps when the caller gives none. It cannot run a forward pass."""
    root = nn.Module()
    for name, p in named_trainable(model):
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        local = p.to_local() if hasattr(p, "to_local") else p
        module.register_parameter(leaf, nn.Parameter(torch.zeros(p.shape, dtype=p.dtype, device=local.device)))
    return root


def shard_island(group: IntraIsland, model: nn.Module, full_model: nn.Module | None) -> nn.Module | None:
    """Every rank of a sharded island, before its island or follower is built: `group` now moves
    weights as `ShardedWeights`, and rank 0's full copy (`full_model`, else a `mirror`) holds the
    ranks' weights. Returns that copy on rank 0, None on the others."""
    if group.rank == 0 and full_model is None:
        full_model = mirror(model)
    weights = ShardedWeights(model, full_model if group.rank == 0 else None)
    group.weights = weights
    weights.pull()
    log.info("sharded island: rank %d holds %d of %d parameters", group.rank, local_numel(model),
             sum(p.numel() for p in model.parameters()))
    return full_model if group.rank == 0 else None


def rank0_parts(model: nn.Module, optimizer: torch.optim.Optimizer,
                full_model: nn.Module | None) -> tuple[nn.Module, Any]:
    """What rank 0's `SwarmIsland` works on: the model and its optimizer, or, on a sharded island
    (`full_model` given by `shard_island`), the full copy and the inner optimizer's hyper-parameters."""
    return (model, optimizer) if full_model is None else (full_model, InnerHyperParams(optimizer))


def gather_on_read(outer: OuterLoop, group: IntraIsland | None, full_model: nn.Module | None) -> None:
    """Rank 0 of a sharded island (`full_model` given): `outer` (a `SwarmIsland`'s, over `full_model`)
    gathers the ranks' weights before reading them; otherwise nothing."""
    if full_model is not None:
        outer.slices = GatheredSlices(full_model, group)
