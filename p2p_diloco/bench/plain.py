"""The plain training loop `bench gpu` measures the islands against: the same model, batch, data and
inner step (`peers.launch.runner.Trainer`: fused AdamW, compile and prefetch as an island has them), with
no swarm around it, in a process of its own (so its compilation and its memory are its own).

`python -m p2p_diloco.bench.plain` prints one JSON line: `tokens_per_s` over `steps` timed steps
after `warmup` untimed ones (compilation, the allocator's first pages), up to a device
synchronisation at each end; `step_s`; the loss of the last step (read once, at the end); and on
CUDA the peak memory the process allocated.
"""

from __future__ import annotations

import argparse
import json
import time

WARMUP_STEPS = 10
"""Untimed steps before the timed ones (the first carries `torch.compile`)."""


def plain_loop(preset: str, data: str, vocab_size: int, device: str, precision: str, batch_size: int,
               steps: int, warmup: int = WARMUP_STEPS) -> dict:
    """Train `warmup + steps` steps of `preset` on the token shards `data`; the figures of the module docstring."""
    import torch

    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.core.data import BatchSampler, load_corpus
    from p2p_diloco.core.device import peak_memory_bytes, resolve_device, synchronize
    from p2p_diloco.core.model import build_model
    from p2p_diloco.peers.launch.runner import Trainer

    where = resolve_device(device)
    corpus = load_corpus(data, vocab_size)
    model_cfg = ModelConfig(size=preset)
    torch.manual_seed(0)
    model = build_model(model_cfg, corpus.vocab_size).to(where)
    trainer = Trainer(model, TrainConfig(device=device, precision=precision, batch_size=batch_size))
    trainer.sampler = BatchSampler(corpus.train, model_cfg.resolved()["block_size"], batch_size, seed=0)
    for _ in range(warmup):
        trainer.step()
    synchronize(where)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = trainer.step()
    synchronize(where)
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": steps * trainer.tokens_per_step / seconds, "step_s": seconds / steps, "steps": steps,
            "loss_last": float(loss), "peak_device_bytes": peak_memory_bytes(where)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m p2p_diloco.bench.plain", description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=WARMUP_STEPS)
    a = p.parse_args(argv)
    print(json.dumps(plain_loop(a.preset, a.data, a.vocab_size, a.device, a.precision, a.batch_size, a.steps,
                                a.warmup)))


if __name__ == "__main__":
    main()
