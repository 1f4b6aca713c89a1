"""The island process of `p2p-diloco join`: device, torchrun ranks, model and data, signals, the loop.

`run_island` builds what the CLI trains (the project's GPT on the device asked for, under torchrun
DDP-wrapped or sharded with FSDP2, `--shard fsdp`, `peers.torchrun.sharding`; the inner loop and its data)
and hands model and optimizer to the public API
(`peers.api` / `peers.island`): rank 0 of a torchrun group, or a plain process, is a
`SwarmIsland`; the other ranks are `RankFollower`s. SIGINT, SIGTERM and SIGHUP (a closed terminal)
ask the island to stop: the round ends at the next step, a checkpoint is written, the record
removed, exit code 130 / 143 / 129. However the loop ends, even by an exception before it began,
the island is closed, which stops its DHT process and with it the libp2p daemon.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Callable

import torch

from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, ModelConfig, NetworkConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler, eval_batches, load_corpus
from p2p_diloco.core.device import peak_memory_bytes, resolve_device
from p2p_diloco.core.inner import evaluate
from p2p_diloco.core.model import from_spec
from p2p_diloco.core.shards import TokenSource
from p2p_diloco.core.sidecar import read_sidecar
from p2p_diloco.core.spec import ModelSpec, model_spec
from p2p_diloco.errors import JoinStopped
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.peers.torchrun.distributed import IntraIsland, RankFollower, launched_world
from p2p_diloco.peers.island import SwarmIsland
from p2p_diloco.peers.parts import IslandParts
from p2p_diloco.peers.launch.runner import Trainer, train
from p2p_diloco.peers.torchrun.sharding import gather_on_read, local_numel, rank0_parts, sharding
from p2p_diloco.terminal import leave_terminal

EVAL_BATCH_SIZE = 16
PROBE_BATCHES, PROBE_SEED = 1, 4321
"""The held-out batch a partner's mix is judged on (`peers.admission.probe`): another than the eval loss's. Not
on a torchrun island: rank 0 alone would run its model between the ranks' steps."""


class _StopFlag:
    """Routes SIGINT / SIGTERM / SIGHUP to the island's `stop()` and remembers which came (the exit code).

    The DHT process, forked once this handler is installed, inherits it. There (another pid) a
    signal does what it would have done without the handler, so that `DHT.shutdown`, which ends
    a process that does not leave in time with SIGTERM, still can. The handler only takes note, so
    it is installed with SA_RESTART: a system call it interrupted resumes. Without, a signal while
    torch starts its shared-memory manager (hivemind's DHT makes it do so) made torch spin forever
    on the interrupted read.
    """

    @staticmethod
    def signals() -> list[int]:
        """SIGINT, SIGTERM, and SIGHUP unless it is ignored (`nohup`: the island outlives its terminal)."""
        hangup = [signal.SIGHUP] if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else []
        return [signal.SIGINT, signal.SIGTERM, *hangup]

    def __init__(self) -> None:
        self.signum: int | None = None
        self.island = None
        self.pid = os.getpid()

    def __call__(self, signum, _frame) -> None:
        if os.getpid() != self.pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGHUP:
            leave_terminal()
        self.signum = signum
        if self.island is not None:
            self.island.stop()

    @property
    def exit_code(self) -> int:
        return 0 if self.signum is None else 128 + self.signum


def _spec(model_cfg: ModelConfig, vocab_size: int, shards: str | None) -> ModelSpec:
    """What the island trains, as its checkpoints describe it: with the tokenizer and end-of-document id the
    token shards' `dataset.json` names (`core.sidecar`), if any."""
    sidecar = read_sidecar(Path(shards)) if shards is not None else None
    return model_spec(model_cfg, vocab_size, tokenizer=sidecar.tokenizer if sidecar else None,
                      eos_id=sidecar.eos_id if sidecar else None)


def run_island(cfg: IslandConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, diloco: DiLoCoConfig,
               network: NetworkConfig, discovery: DiscoveryConfig, data: str | None = None,
               vocab_size: int | None = None, trainer_type: Callable[..., Trainer] = Trainer,
               parts: IslandParts | None = None, link: EmulatedLink | None = None) -> tuple[int, dict]:
    """Run one island until a limit or a signal. Returns (exit code, summary; empty on ranks > 0).

    `trainer_type(model, train_cfg)` builds the inner loop and `parts` the island's parts
    (`peers.parts`): the fault injection of benchmarks and tests goes there (`bench.member`), as
    does `link`, a WAN link to emulate."""
    device = resolve_device(train_cfg.device)
    # DDP or FSDP2 under torchrun (`peers.torchrun.sharding`); a shard without torchrun fails here, before anything starts
    strategy = sharding(train_cfg.shard, launched_world())
    group = IntraIsland.init_from_env(device)
    stop = _StopFlag()
    previous = {sig: signal.signal(sig, stop) for sig in stop.signals()}
    for sig in previous:  # SA_RESTART: torch spins forever on a read a signal interrupts (see `_StopFlag`)
        signal.siginterrupt(sig, False)
    island = None
    try:
        corpus = load_corpus(data, vocab_size)
        spec = _spec(model_cfg, corpus.vocab_size, data if isinstance(corpus.train, TokenSource) else None)
        block = spec.block_size
        torch.manual_seed(train_cfg.seed)  # every island starts from the same weights
        model = from_spec(spec).to(device)
        full = None  # a sharded island's rank 0: the full-size copy the swarm sees (`peers.torchrun.sharding`)
        if group is not None:
            model = strategy.wrap(model, group)
            full = strategy.full_copy(group, model, lambda: from_spec(spec).to(device))
        trainer = trainer_type(model, train_cfg)
        if group is not None and group.rank > 0:
            island = RankFollower(model, group)
            seed = group.share(0) + group.rank
        else:
            evals = eval_batches(corpus.val, block, cfg.eval_batches, EVAL_BATCH_SIZE)
            probes = eval_batches(corpus.val, block, PROBE_BATCHES, EVAL_BATCH_SIZE, seed=PROBE_SEED)
            whole, inner = rank0_parts(model, trainer.optimizer, full)
            island = SwarmIsland(whole, inner, diloco=diloco, network=network, discovery=discovery,
                                 island=cfg, eval_fn=lambda: evaluate(whole, evals, train_cfg.precision),
                                 probe_fn=None if group is not None else lambda: evaluate(model, probes, train_cfg.precision),
                                 extra_state=trainer, group=group, link=link, stopped=lambda: stop.signum is not None,
                                 parts=parts, model_spec=spec)
            gather_on_read(island.outer, group, full)
            seed = int.from_bytes(hashlib.sha256(island.peer_id.encode()).digest()[:4], "little")
            seed = seed if group is None else group.share(seed)
        trainer.sampler = BatchSampler(corpus.train, block, train_cfg.batch_size, seed)
        stop.island = island
        if stop.signum is not None:
            island.stop()
        by_time = bool(cfg.max_seconds and not (cfg.max_tokens or cfg.max_rounds))
        with island:
            train(island, trainer, cfg.max_seconds, size_by_time=by_time)
        summary = island.close()  # (its summary line: `SwarmIsland.close`)
        if group is not None:
            group.leave_together()
        if summary:  # what the device's memory came to (the CUDA allocator's peak; None elsewhere), what rank 0 trains
            summary = {**summary, "peak_device_bytes": peak_memory_bytes(device), "shard": train_cfg.shard,
                       "rank_params": local_numel(model)}
        return stop.exit_code, summary
    except JoinStopped:  # a signal while it waited for a bootstrap node: nothing to save or tell
        return stop.exit_code, {}
    finally:
        if isinstance(island, SwarmIsland):  # idempotent; covers a failure before `with` too
            island.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if group is not None:
            group.close()
