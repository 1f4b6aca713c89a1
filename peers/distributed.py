"""Several processes as one island under torchrun: DDP inside the island, only rank 0 gossips.

Rank 0 owns everything that talks to the swarm (snapshot server, membership, partner fetches,
the outer step, checkpoints). The other ranks only run inner steps; DDP averages their gradients
every step, so all ranks hold the same weights. Rank 0 drives the ranks with a tiny command
broadcast before each action (STEP, NEW_ANCHOR followed by the anchor itself, SHIFT followed by
the shift a partner's mid-round mix applies to the weights, STOP), which keeps
them in lockstep even when a round ends early on its time budget.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

STEP, NEW_ANCHOR, STOP, SHIFT = 1, 2, 3, 4


class IntraIsland:
    """The process group of one island (torchrun's environment variables describe it)."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._cmd = torch.zeros(1, dtype=torch.int64)
        log.info("island rank %d of %d (%s)", self.rank, self.world, backend)

    @staticmethod
    def from_env() -> "IntraIsland | None":
        """A process group when started by torchrun with more than one process, else None."""
        return IntraIsland() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)

    def command(self, cmd: int) -> None:
        """Rank 0: tell every rank what comes next."""
        self._cmd.fill_(cmd)
        dist.broadcast(self._cmd, src=0)

    def next_command(self) -> int:
        dist.broadcast(self._cmd, src=0)
        return int(self._cmd.item())

    def share_anchor(self, phi: torch.Tensor) -> None:
        """Rank 0 sends its new anchor; the other ranks receive it into `phi`."""
        if self.rank == 0:
            self.command(NEW_ANCHOR)
        dist.broadcast(phi, src=0)

    def share_shift(self, shift: torch.Tensor) -> None:
        """Rank 0 sends the shift of a mid-round mix; the other ranks receive it into `shift`."""
        if self.rank == 0:
            self.command(SHIFT)
        dist.broadcast(shift, src=0)

    def share_seed(self, seed: int) -> int:
        """Rank 0's data seed, on every rank (each rank then adds its own rank)."""
        t = torch.tensor([seed], dtype=torch.int64)
        dist.broadcast(t, src=0)
        return int(t.item()) + self.rank

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def follow(group: IntraIsland, island) -> int:
    """The loop of a rank other than 0: inner steps and anchors as rank 0 commands, until STOP.

    Signals are left to rank 0 (torchrun sends them to every rank): a follower stops when told.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    while True:
        cmd = group.next_command()
        if cmd == STEP:
            island.inner_step()
        elif cmd == NEW_ANCHOR:
            group.share_anchor(island.state.phi)
            island.begin_round()
        elif cmd == SHIFT:
            shift = torch.zeros_like(island.state.phi)
            group.share_shift(shift)
            island.shift_weights(shift)
        elif cmd == STOP:
            return 0
        else:
            raise RuntimeError(f"unknown island command {cmd}")
