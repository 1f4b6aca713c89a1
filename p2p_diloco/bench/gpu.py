"""`p2p-diloco bench gpu`: the first run on a GPU machine, as one JSON object.

In one invocation, on one device and on the same data:

- `plain`: the islands' model and batch in a plain training loop, no swarm (`bench.plain`, its own
  process): the device's tokens/s for this inner step, the baseline;
- `islands`: two islands of `preset` (default `gpt2-small`, GPT-2's 124M shape at its 50257-token
  vocabulary) in bf16 on the one device, as `join --device cuda --precision bf16` processes with a
  bootstrap node (the demo's machinery, `peers.launch.demo.run_swarm`), for `rounds` rounds (default 20);
  per island its steady-state figures (rounds 2 on: the first carries start-up, compilation and
  warm-up), where its time went (`spent`, `peers.rounds.timebook`), start-up apart, and MFU;
- `islands_vs_plain`: the two islands' tokens/s together against the plain loop's (they share the
  device: together they should get what one plain loop gets);
- `big`: two islands of `big_preset` (default `gpt2-1b`, about 1B parameters) for `big_rounds`
  rounds at `big_batch_size`, as memory allows two on one device: tokens/s, utilization, peak
  memory, mixes;
- `round`: `bench round` at `preset`'s size on the device (`bench.round.run_round`).

MFU is the usual 6 x parameters x tokens/s over the device's dense bf16 peak (`PEAK_BF16_FLOPS`, by
the device's name; None for a device not listed, or for fp32). Nothing is downloaded: the data are
token shards written here (`core.shards.write_shard`) from the embedded corpus (this Python's
standard-library sources), one byte a token id under the model's vocabulary, so the loss has
something to learn (random ids would hold it at ln(vocab)).

Memory: peak against model + optimizer (fp32 weights, gradients and AdamW's two moments, 16 bytes
a parameter): on CUDA the largest `torch.cuda.max_memory_allocated` of the islands' processes,
elsewhere `bench round`'s `peak_extra_bytes` (the resident set above the island's baseline during a
round).

On the CPU with `--preset tiny --big-preset tiny` and a few steps it runs in a minute, so CI keeps
it working.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from p2p_diloco.bench.round import GPT2_VOCAB, run_round, shape_params
from p2p_diloco.bench.swarm import rounds as round_rows
from p2p_diloco.config import DiLoCoConfig, ModelConfig
from p2p_diloco.peers.launch.demo import DemoConfig, run_swarm

DATA_BYTES = 8 * 2**20
"""Bytes of the embedded corpus written as token shards (its held-out files go to `val.bin`)."""
MODEL_OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 weights, gradients and AdamW's two moments."""
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12), ("A100", 312e12),
                   ("L40S", 362e12), ("L4", 121e12))
"""Dense bf16 tensor-core peak by a device name's part (the first that matches), from the vendors' sheets."""
PLAIN_RUN_S = 600.0
"""Limit of the plain loop's process."""


def write_data(folder: Path, vocab_size: int, max_bytes: int = DATA_BYTES) -> Path:
    """`train.bin` and `val.bin` in `folder`: the embedded corpus's bytes as token ids of a `vocab_size` vocabulary."""
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.core.shards import write_shard

    corpus = load_corpus(max_bytes=max_bytes)
    write_shard(folder / "train.bin", corpus.train, vocab_size)
    write_shard(folder / "val.bin", corpus.val, vocab_size)
    return folder


def peak_flops(device_name: str, precision: str) -> float | None:
    """The device's dense peak for `precision` (bf16 only), None when unknown."""
    if precision != "bf16":
        return None
    return next((flops for part, flops in PEAK_BF16_FLOPS if part in device_name), None)


def mfu(params: int, tokens_per_s: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilization: 6 x parameters x tokens/s over the peak."""
    return None if peak is None or not tokens_per_s else 6 * params * tokens_per_s / peak


def steady(rows: list[dict]) -> list[dict]:
    """The rounds after the first (which carries start-up and warm-up); all of them if there is one."""
    return rows[1:] if len(rows) > 1 else rows


def island_row(summary: dict[str, Any], rows: list[dict], params: int, peak: float | None) -> dict[str, Any]:
    """One island's figures from its summary and its per-round metrics rows."""
    later = steady(rows)
    start = rows[0] if len(rows) > 1 else {"own_tokens": 0, "wall_s": 0.0}
    seconds = later[-1]["wall_s"] - start["wall_s"] if later else 0.0
    tokens_per_s = (later[-1]["own_tokens"] - start["own_tokens"]) / seconds if seconds > 0 else None
    spent = {k: sum(r["spent"][k] for r in later) for k in later[0]["spent"]} if later else {}
    whole = sum(spent.values())
    return {"name": summary["name"], "tokens": summary["tokens"], "rounds": summary["rounds"],
            "tokens_per_s": tokens_per_s, "mfu": mfu(params, tokens_per_s, peak),
            "utilization": summary["utilization"],
            "steady_utilization": spent["inner"] / whole if whole > 0 else None,
            "steady_spent_s": {k: round(v, 3) for k, v in spent.items()},
            "startup_s": summary["spent"]["startup"], "final_s": summary["spent"]["final"],
            "publish_s": summary["publish_s"], "coalesced": summary["coalesced"],
            "loss_start": summary["initial_loss"], "loss_end": summary["eval_loss"],
            "train_loss_end": rows[-1]["loss"] if rows else None,
            "mixes": summary["mixes"], "failed_fetches": summary["failed_fetches"],
            "peak_device_bytes": summary.get("peak_device_bytes")}


def two_islands(name: str, preset: str, rounds: int, local_steps: int, batch_size: int, device: str, precision: str,
                data: Path, vocab_size: int, workdir: Path, peak: float | None,
                say: Callable[[str], None]) -> dict[str, Any]:
    """Two islands of `preset` on `device` for `rounds` rounds: their rows (`island_row`), and the swarm's wall time."""
    shape = ModelConfig(size=preset).resolved()
    params = shape_params({**shape, "vocab_size": vocab_size})
    per_island = rounds * local_steps * batch_size * shape["block_size"]
    say(f"{name}: 2 islands of {preset} ({params:,} parameters) on {device} in {precision}: {rounds} rounds of "
        f"{local_steps} steps at batch {batch_size}, {per_island:,} tokens each")
    cfg = DemoConfig(islands=2, max_tokens=per_island, local_steps=local_steps, run_id=f"bench-gpu-{name}",
                     workdir=workdir, data=str(data), vocab_size=vocab_size,
                     extra_args=("--model", preset, "--device", device, "--precision", precision,
                                 "--batch-size", str(batch_size)))
    started = time.monotonic()
    run_dir, names, summaries = run_swarm(cfg)
    islands = [island_row(s, round_rows(run_dir / n), params, peak) for s, n in zip(summaries, names)]
    return {"preset": preset, "params": params, "batch_size": batch_size, "rounds": rounds, "islands": islands,
            "wall_s": round(time.monotonic() - started, 1)}


def plain_loop(preset: str, data: Path, vocab_size: int, device: str, precision: str, batch_size: int,
               steps: int, params: int, peak: float | None) -> dict[str, Any]:
    """The plain loop's figures (`bench.plain`, in a fresh process), with its MFU."""
    cmd = [sys.executable, "-m", "p2p_diloco.bench.plain", "--preset", preset, "--data", str(data), "--vocab-size",
           str(vocab_size), "--device", device, "--precision", precision, "--batch-size", str(batch_size),
           "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=PLAIN_RUN_S)
    if out.returncode:
        raise RuntimeError(f"the plain training loop failed: {out.stderr[-2000:]}")
    row = json.loads(out.stdout.splitlines()[-1])
    return {**row, "mfu": mfu(params, row["tokens_per_s"], peak)}


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
                  vocab_size: int = GPT2_VOCAB, rounds: int = 20, local_steps: int = 15, batch_size: int = 16,
                  big_preset: str | None = "gpt2-1b", big_rounds: int = 3, big_batch_size: int = 4, plain_steps: int = 30,
                  workdir: Path | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The plain loop, two islands of `preset`, two of `big_preset` (None or 0 rounds: skipped), then
    `bench round` at `preset`'s size, all on `device`; the JSON object of the module docstring."""
    import torch

    from p2p_diloco.core.device import autocast, resolve_device

    say = log or (lambda msg: None)
    where = resolve_device(device)
    autocast(where, precision)  # an unusable device or precision fails here, before any process starts
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else platform.machine()
    peak = peak_flops(name, precision)
    params = shape_params({**ModelConfig(size=preset).resolved(), "vocab_size": vocab_size})
    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-bench-gpu-"))
    data = write_data(workdir / "data", vocab_size)
    say(f"on {where} ({name}), files in {workdir}; the plain loop: {preset}, {plain_steps} steps at batch {batch_size}")
    plain = plain_loop(preset, data, vocab_size, device, precision, batch_size, plain_steps, params, peak)
    say(f"plain loop: {plain['tokens_per_s']:,.0f} tokens/s")
    small = two_islands("islands", preset, rounds, local_steps, batch_size, device, precision, data, vocab_size,
                        workdir / "swarm", peak, say)
    together = sum(i["tokens_per_s"] or 0.0 for i in small["islands"])
    big = None
    if big_preset and big_rounds > 0:
        big = two_islands("big", big_preset, big_rounds, local_steps, big_batch_size, device, precision, data,
                          vocab_size, workdir / "big", peak, say)
    say(f"bench round at {params:,} parameters on {where}")
    (row,) = run_round([params], log=say, exchanges=(DiLoCoConfig.exchange,), device=device)["rows"]
    return {"device": str(where), "device_name": name, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "preset": preset, "params": params, "vocab_size": vocab_size, "precision": precision,
            "batch_size": batch_size, "block_size": ModelConfig(size=preset).resolved()["block_size"],
            "local_steps": local_steps, "rounds": rounds, "peak_flops": peak, "plain": plain,
            "islands": small["islands"], "islands_tokens_per_s": together,
            "islands_vs_plain": together / plain["tokens_per_s"], "islands_mfu": mfu(params, together, peak),
            "big": big, "round": row, "memory": memory(small["islands"], row, params),
            "swarm_wall_s": small["wall_s"], "workdir": str(workdir)}
