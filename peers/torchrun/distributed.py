"""Several processes as one island under torchrun: DDP (or FSDP2, `peers.torchrun.sharding`) inside, only rank 0 gossips.

Every rank runs the same training loop and calls `step()` after each inner step. Rank 0 is a
`SwarmIsland` (snapshot server, membership, fetches, outer step, checkpoints); the other ranks are
`RankFollower`s. DDP averages the gradients every step, so all ranks hold the same weights until
rank 0 changes its own (a partner mixed on arrival, the outer step's new anchor, a join or a
resume). At every `step()` rank 0 broadcasts one command, and the ranks act on it together:

- `CARRY_ON`: nothing changed;
- `SYNC`: rank 0's weights changed; every rank receives them (a broadcast per parameter);
- `NEW_ROUND`: a round ended (the outer step's new anchor): `SYNC`, and every rank counts the round;
- `STOP`: the island is done; `SYNC` (a final mix may have changed the weights), and `done`
  turns True on every rank at the same step;
- `GATHER` (sharded islands only, before any of the others): rank 0 is about to read the weights;
  every rank sends it its shard (`peers.torchrun.sharding`), then waits for the step's command.

So the ranks never drift apart, whatever ends a round early, and no rank but 0 holds an anchor.
How weights travel between the ranks is the island's `weights` (`Replicas` here: DDP, every rank
holds them all; `peers.torchrun.sharding.ShardedWeights`: FSDP2, each rank a shard and rank 0 a full copy).
NCCL islands keep the command on the rank's GPU (NCCL only moves device tensors); gloo on the host.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys

from typing import NoReturn, Protocol

import torch
import torch.distributed as dist

from p2p_diloco.core.params import trainable_parameters

log = logging.getLogger(__name__)

CARRY_ON, SYNC, NEW_ROUND, STOP, GATHER = 0, 1, 2, 3, 4
WITH_WEIGHTS = (SYNC, NEW_ROUND, STOP)
"""The commands after which every rank takes rank 0's weights."""


class RankWeights(Protocol):
    """How rank 0's weights reach the other ranks of an island, and theirs reach rank 0."""

    stale: bool
    """Rank 0: the ranks trained since it last read the weights (it must `pull` before reading them)."""

    def push(self, params: list[torch.Tensor]) -> None:
        """Every rank: take rank 0's weights (`params`: rank 0's own, or this rank's)."""

    def pull(self) -> None:
        """Every rank: rank 0's copy of the weights becomes what the ranks hold."""

    def trained(self) -> None:
        """Rank 0: the ranks train on from here (a command went out)."""


class Replicas:
    """DDP: every rank holds the whole model, DDP keeps the copies equal, and rank 0's weights,
    when it changes them, go to the others one broadcast per parameter."""

    stale = False

    @torch.no_grad()
    def push(self, params: list[torch.Tensor]) -> None:
        for p in params:
            dist.broadcast(p.data, src=0)

    def pull(self) -> None:
        """Nothing to gather: rank 0 holds the weights the ranks trained."""

    def trained(self) -> None:
        """Rank 0's weights are the ranks' own: never stale."""


class IntraIsland:
    """The process group of one island (the default group torchrun describes)."""

    def __init__(self) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = dist.get_backend()
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self._cmd = torch.zeros(1, dtype=torch.int64, device=device)
        self.weights: RankWeights = Replicas()
        self.stop_told = False
        """Rank 0 told `STOP`: the other ranks follow no more commands."""

    @staticmethod
    def init_from_env(device: torch.device, timeout_s: float = 120.0) -> IntraIsland | None:
        """Start the process group when torchrun started more than one process, else None: NCCL
        when the island trains on CUDA (each rank on its own GPU), gloo otherwise."""
        if launched_world() <= 1:
            return None
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        group = IntraIsland()
        log.info("island rank %d of %d (%s)", group.rank, group.world, backend)
        return group

    @staticmethod
    def current() -> IntraIsland | None:
        """The initialised default group when it has more than one process, else None."""
        return IntraIsland() if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        device_ids = [self._cmd.device.index] if self._cmd.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)

    def send(self, cmd: int) -> None:
        """Rank 0: tell every rank what this step did (the weights they will take are gathered first
        if rank 0 never read them this step: sharded islands)."""
        if cmd in WITH_WEIGHTS:
            self.refresh()
        self._cmd.fill_(cmd)
        dist.broadcast(self._cmd, src=0)
        self.weights.trained()

    def refresh(self) -> None:
        """Rank 0, before it reads the weights: if the ranks trained since, gather them (`GATHER`)."""
        if self.weights.stale:
            self._cmd.fill_(GATHER)
            dist.broadcast(self._cmd, src=0)
            self.weights.pull()

    def receive(self) -> int:
        dist.broadcast(self._cmd, src=0)
        return int(self._cmd.item())

    def sync_weights(self, params: list[torch.Tensor]) -> None:
        """Every rank takes rank 0's trainable weights."""
        self.weights.push(params)

    def tell(self, cmd: int, params: list[torch.Tensor]) -> None:
        """Rank 0, after each step: what it did (`send`), then rank 0's `params` when the ranks take
        them; nothing once `STOP` was told."""
        if self.stop_told:
            return
        self.send(cmd)
        if cmd in WITH_WEIGHTS:
            self.sync_weights(params)
        self.stop_told = cmd == STOP

    def share(self, value: int) -> int:
        """Rank 0's `value` on every rank (a data seed, a schedule length)."""
        t = torch.tensor([value], dtype=torch.int64, device=self._cmd.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def leave_together(self) -> None:
        """Every rank, once its island closed cleanly: wait for the others, so that no rank tears its
        process group down (and exits) while rank 0 still closes (gloo aborted such a rank at exit)."""
        dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class RankFollower:
    """A rank other than 0 of a torchrun island: the same interface as `SwarmIsland` for the loop
    (`step`, `done`, `with`), following rank 0's command at each step (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, group: IntraIsland) -> None:
        self.params, self.group = trainable_parameters(model), group
        self.done = False
        self.round = 0

    def __enter__(self) -> RankFollower:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> RankFollower:
        self._follow()  # rank 0's starting point (joined, resumed or initial)
        return self

    def step(self, loss=None, tokens: int | None = None) -> None:
        if not self.done:
            self._follow()

    def stop(self) -> None:
        """Signals are rank 0's to act on (torchrun sends them to every rank)."""

    def share(self, value: int) -> int:
        """Rank 0's value, in place of this rank's own (see `SwarmIsland.share`)."""
        return self.group.share(value)

    def _follow(self) -> None:
        cmd = self.group.receive()
        while cmd == GATHER:  # rank 0 reads the weights of a sharded island: send it this rank's shard
            self.group.weights.pull()
            cmd = self.group.receive()
        if cmd in WITH_WEIGHTS:
            self.group.sync_weights(self.params)
            self.round += cmd == NEW_ROUND
            self.done = cmd == STOP
        elif cmd != CARRY_ON:
            raise RuntimeError(f"unknown island command {cmd}")

    def close(self) -> dict:
        """Wait for rank 0 to stop the island (it does at its last step or when it closes)."""
        while not self.done:
            self._follow()
        return {}


def exit_process(code: int) -> NoReturn:
    """End the process with this code. A torchrun rank leaves without the interpreter's finalization:
    gloo's worker threads can still hold tensors then, and freeing them aborted the rank (SIGABRT,
    "terminate called without an active exception") after its process group was destroyed."""
    if launched_world() <= 1:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launched_world() -> int:
    """How many processes torchrun started for this island (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))
