"""`p2p-diloco bench gpu`: the first run on a GPU machine, as one JSON object.

Two islands train the `gpt2-small` preset (GPT-2's 124M shape at its 50257-token vocabulary) in
bf16 on one GPU, as `join --device cuda --precision bf16` processes with a bootstrap node (the
demo's machinery, `peers.demo.run_swarm`), for a few rounds each; then `bench round` measures one
gossip round of the same size on the same device (`bench.round.run_round`). Nothing is downloaded:
the data are token shards written here (`core.shards.write_shard`) from the embedded corpus (this
Python's standard-library sources), one byte a token id under the model's vocabulary, so the
loss has something to learn (random ids would hold it at ln(vocab)).

The object: per island its tokens, tokens/s (after its first round, which carries the CUDA
warm-up), loss at start and end (held-out, as the island evaluates it), mixes; the round's
overhead against a clone of the state (`bench round`'s row); peak memory against model +
optimizer (fp32 weights, gradients and AdamW's two moments, 16 bytes a parameter): on CUDA the
largest `torch.cuda.max_memory_allocated` of the islands' processes, elsewhere `bench round`'s
`peak_extra_bytes` (the resident set above the island's baseline during a round).

On the CPU with `--preset tiny` and a few steps it runs in seconds, so CI keeps it working.
"""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from p2p_diloco.bench.round import GPT2_VOCAB, run_round, shape_params
from p2p_diloco.bench.swarm import rounds as round_rows
from p2p_diloco.config import DiLoCoConfig, ModelConfig
from p2p_diloco.peers.demo import DemoConfig, run_swarm

DATA_BYTES = 8 * 2**20
"""Bytes of the embedded corpus written as token shards (its held-out files go to `val.bin`)."""
MODEL_OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 weights, gradients and AdamW's two moments."""


def write_data(folder: Path, vocab_size: int, max_bytes: int = DATA_BYTES) -> Path:
    """`train.bin` and `val.bin` in `folder`: the embedded corpus's bytes as token ids of a `vocab_size` vocabulary."""
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.core.shards import write_shard

    corpus = load_corpus(max_bytes=max_bytes)
    write_shard(folder / "train.bin", corpus.train, vocab_size)
    write_shard(folder / "val.bin", corpus.val, vocab_size)
    return folder


def island_row(summary: dict[str, Any], rows: list[dict]) -> dict[str, Any]:
    """One island's figures from its summary and its per-round metrics rows."""
    steady = rows[1:] if len(rows) > 1 else rows  # the first round carries start-up and warm-up
    start = rows[0] if len(rows) > 1 else {"own_tokens": 0, "wall_s": 0.0}
    seconds = steady[-1]["wall_s"] - start["wall_s"]
    return {"name": summary["name"], "tokens": summary["tokens"], "rounds": summary["rounds"],
            "tokens_per_s": (steady[-1]["own_tokens"] - start["own_tokens"]) / seconds if seconds > 0 else None,
            "utilization": summary["utilization"], "loss_start": summary["initial_loss"],
            "loss_end": summary["eval_loss"], "train_loss_end": rows[-1]["loss"] if rows else None,
            "mixes": summary["mixes"], "failed_fetches": summary["failed_fetches"],
            "peak_device_bytes": summary.get("peak_device_bytes")}


def memory(islands: list[dict], round_row: dict, params: int) -> dict[str, Any]:
    """Peak memory against model + optimizer: the islands' CUDA peak where there is one, else `bench round`'s."""
    base = MODEL_OPTIMIZER_BYTES_PER_PARAM * params
    cuda = [i["peak_device_bytes"] for i in islands if i["peak_device_bytes"] is not None]
    if cuda:
        peak, method = max(cuda), "torch.cuda.max_memory_allocated, the largest of the islands' processes"
    else:
        peak, method = round_row["peak_extra_bytes"], "bench round's peak_extra_bytes (resident set above the island's)"
    return {"model_optimizer_bytes": base, "peak_bytes": peak, "peak_vs_model_optimizer": peak / base,
            "method": method}


def run_bench_gpu(device: str = "cuda", preset: str = "gpt2-small", precision: str = "bf16",
                  vocab_size: int = GPT2_VOCAB, rounds: int = 4, local_steps: int = 15, batch_size: int = 16,
                  workdir: Path | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Two islands of `preset` on `device`, `rounds` rounds of `local_steps` steps each, then `bench
    round` at its size there; the JSON object of the module docstring."""
    import torch

    from p2p_diloco.core.device import autocast, resolve_device

    say = log or (lambda msg: None)
    where = resolve_device(device)
    autocast(where, precision)  # an unusable device or precision fails here, before any process starts
    shape = ModelConfig(size=preset).resolved()
    params = shape_params({**shape, "vocab_size": vocab_size})
    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-bench-gpu-"))
    data = write_data(workdir / "data", vocab_size)
    per_island = rounds * local_steps * batch_size * shape["block_size"]
    say(f"2 islands of {preset} ({params:,} parameters) on {where} in {precision}: {rounds} rounds of {local_steps} "
        f"steps, {per_island:,} tokens each; files in {workdir}")
    cfg = DemoConfig(islands=2, max_tokens=per_island, local_steps=local_steps, run_id="bench-gpu",
                     workdir=workdir / "swarm", data=str(data), vocab_size=vocab_size,
                     extra_args=("--model", preset, "--device", device, "--precision", precision,
                                 "--batch-size", str(batch_size)))
    started = time.monotonic()
    run_dir, names, summaries = run_swarm(cfg)
    swarm_s = time.monotonic() - started
    islands = [island_row(s, round_rows(run_dir / n)) for s, n in zip(summaries, names)]
    say(f"swarm done in {swarm_s:.0f} s; bench round at {params:,} parameters on {where}")
    (row,) = run_round([params], log=say, exchanges=(DiLoCoConfig.exchange,), device=device)["rows"]
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else platform.machine()
    return {"device": str(where), "device_name": name, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "preset": preset, "params": params, "vocab_size": vocab_size, "precision": precision,
            "batch_size": batch_size, "block_size": shape["block_size"], "local_steps": local_steps,
            "rounds": rounds, "islands": islands, "round": row, "memory": memory(islands, row, params),
            "swarm_wall_s": round(swarm_s, 1), "workdir": str(workdir)}
