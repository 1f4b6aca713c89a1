"""A Hugging Face GPT-2, built from a config, trained on token shards as an island of a swarm, through `p2p_diloco.join`.

The model is `transformers.GPT2LMHeadModel(GPT2Config(...))`, small by default and over bytes (no
tokenizer, nothing downloaded); the data are token shards (llm.c's format) that the script writes
from the project's embedded corpus (this Python's standard-library sources) on first run and reads
with the project's sampler. The loop is a plain PyTorch loop; `island.step()` after each step.

    # one process (trains alone without --bootstrap; give a swarm's addresses to join it)
    python examples/hf_gpt2.py --max-rounds 2
    # one island of 2 processes, the model sharded with FSDP2 (gloo on the CPU, NCCL on GPUs)
    torchrun --standalone --nproc-per-node 2 examples/hf_gpt2.py --fsdp --max-rounds 2
    # the same with DDP (every rank holds the whole model)
    torchrun --standalone --nproc-per-node 2 examples/hf_gpt2.py --max-rounds 2

Under torchrun, rank 0 gossips for the island. With `--fsdp` it also keeps a full-size copy of the
weights (`full_model`), which is what travels, is checkpointed, and what its held-out loss is
measured on (`island.model`): rank 0 evaluates alone, and the sharded model would wait for the
other ranks. Needs `pip install transformers`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import p2p_diloco
from p2p_diloco import DiLoCoConfig, IslandConfig
from p2p_diloco.core.data import BYTE_VOCAB, BatchSampler, eval_batches, load_corpus
from p2p_diloco.core.shards import write_shard
from p2p_diloco.peers.torchrun.distributed import exit_process

SHARDS = 4
"""Training shards the script writes (plus one held-out shard)."""


def make_shards(folder: Path, max_bytes: int = 4_000_000) -> Path:
    """Token shards of the embedded corpus as bytes (ids 0..255): `train_00.bin`... and `val.bin`; once."""
    if not (folder / "val.bin").exists():
        corpus = load_corpus(None, max_bytes=max_bytes)
        for i, part in enumerate(torch.tensor_split(corpus.train, SHARDS)):
            write_shard(folder / f"train_{i:02d}.bin", part, BYTE_VOCAB)
        write_shard(folder / "val.bin", corpus.val, BYTE_VOCAB)
    return folder


def build(args: argparse.Namespace):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=BYTE_VOCAB, n_positions=args.context, n_embd=args.n_embd, n_layer=args.n_layer,
                        n_head=args.n_head, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def loss_on(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp", action="store_true", help="under torchrun: shard the model with FSDP2 (default DDP)")
    parser.add_argument("--max-rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=10, help="H: inner steps per round")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step on each process")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bootstrap", action="append", default=None, help="a bootstrap node's address (repeatable)")
    parser.add_argument("--run-id", default="hf-gpt2")
    parser.add_argument("--workdir", default="runs/hf-gpt2", help="token shards and the island's run directory")
    parser.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    args = parser.parse_args()

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.fsdp and world < 2:
        parser.error("--fsdp shards the model over the processes of a torchrun island: run it under torchrun")
    rank = 0
    if world > 1:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        rank = dist.get_rank()
    workdir = Path(args.workdir)
    if rank == 0:
        make_shards(workdir / "shards")
    if world > 1:
        dist.barrier()  # the shards are written
    corpus = load_corpus(workdir / "shards")

    torch.manual_seed(0)  # every island starts from the same weights
    model = build(args)
    full = None
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:  # each block gathered for its own forward and backward
            fully_shard(block)
        fully_shard(model)
        full = build(args) if rank == 0 else None  # rank 0's full copy: what travels and is evaluated
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)  # after sharding, as usual
    held_out = eval_batches(corpus.val, args.context, 2, 16)

    @torch.no_grad()
    def held_out_loss() -> float:  # rank 0 alone: on the full copy when sharded
        m = island.model
        m.eval()
        loss = sum(loss_on(m, x, y).item() for x, y in held_out) / len(held_out)
        m.train()
        return loss

    island = p2p_diloco.join(model, optimizer, bootstrap=args.bootstrap, run_id=args.run_id,
                             run_dir=workdir / "island", diloco=DiLoCoConfig(local_steps=args.local_steps),
                             island=IslandConfig(max_rounds=args.max_rounds, resume=args.resume, quiet=rank > 0),
                             eval_fn=held_out_loss, full_model=full)
    signal.signal(signal.SIGTERM, lambda *_: island.stop())  # end the round, checkpoint and leave cleanly
    sampler = BatchSampler(corpus.train, args.context, args.batch_size, seed=island.share(1234) + rank)
    with island:
        while not island.done:
            x, y = sampler.next()
            loss = loss_on(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            island.step(loss=loss, tokens=x.numel())
    summary = island.close()
    if rank == 0:
        keys = ("rounds", "version", "tokens", "initial_loss", "eval_loss", "mixes")
        print(json.dumps({"fsdp": args.fsdp, "world": world, **{k: summary[k] for k in keys}}))
    if world > 1:  # the ranks leave together: none tears its process group down while rank 0 still closes
        dist.barrier()
        dist.destroy_process_group()
    exit_process(0)  # a torchrun rank leaves without the interpreter's finalization (gloo aborted it there)


if __name__ == "__main__":
    main()
