"""Your own model, optimizer, data and training loop on a p2p-diloco swarm, through `p2p_diloco.join`.

Nothing here is the project's: the model is a tiny causal convolutional language model over bytes,
the optimizer AdamW with a warmup schedule, the data this Python's standard-library sources, and
the loop a plain PyTorch loop that calls `island.step()` after each `optimizer.step()`. The island
does the rest in the background: rounds of H inner steps, an outer step, publishing its state,
fetching a partner's and mixing it in.

    python examples/own_loop.py                 # a bootstrap node and 2 islands on 127.0.0.1, ~1 minute
    python examples/own_loop.py --json          # one JSON object on stdout: each island's losses and mixes
    python examples/own_loop.py --islands 3 --seconds 120 --workdir runs/own-loop
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import p2p_diloco
from p2p_diloco import DiLoCoConfig, IslandConfig

CONTEXT, BATCH, WIDTH = 64, 32, 96
HELD_OUT_SEED = 1234
"""The held-out batch is drawn with this seed, so every island measures the same batch."""


class ByteConvLM(nn.Module):
    """Next-byte prediction with dilated causal convolutions (receptive field 15 bytes)."""

    def __init__(self, width: int = WIDTH, dilations: tuple[int, ...] = (1, 2, 4)) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.convs = nn.ModuleList(nn.Conv1d(width, width, kernel_size=3, dilation=d) for d in dilations)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).transpose(1, 2)  # (B, C, T)
        for conv in self.convs:
            pad = 2 * conv.dilation[0]  # left padding only: position t never sees t+1
            h = h + F.gelu(conv(F.pad(h, (pad, 0))))
        return self.head(self.norm(h.transpose(1, 2)))  # (B, T, 256)


def load_bytes(limit: int = 2_000_000) -> tuple[torch.Tensor, torch.Tensor]:
    """This Python's standard-library sources as bytes, in a fixed order: (train, held out)."""
    data = bytearray()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data += path.read_bytes()
        if len(data) >= limit:
            break
    t = torch.frombuffer(data, dtype=torch.uint8).long()
    cut = int(0.9 * len(t))
    return t[:cut], t[cut:]


def sample(data: torch.Tensor, gen: torch.Generator, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows: inputs and the same windows shifted by one byte, both (B, T)."""
    starts = torch.randint(len(data) - CONTEXT - 1, (batch,), generator=gen)
    windows = torch.stack([data[s:s + CONTEXT + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def loss_on(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def run_island(index: int, bootstrap: list[str], seconds: float, islands: int, workdir: Path) -> dict:
    """One island: the user's model, optimizer, scheduler and loop, joined to the swarm."""
    torch.set_num_threads(1)  # islands share the machine's cores
    train, held_out = load_bytes()
    x_val, y_val = sample(held_out, torch.Generator().manual_seed(HELD_OUT_SEED), batch=256)

    @torch.no_grad()
    def held_out_loss() -> float:
        model.eval()
        loss = loss_on(model, x_val, y_val).item()
        model.train()
        return loss

    torch.manual_seed(0)  # every island starts from the same weights
    model = ByteConvLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50))  # warmup
    gen = torch.Generator().manual_seed(100 + index)  # each island samples its own batches
    loss_start = held_out_loss()

    # Discovery: the default (`auto`) picks the hivemind DHT when given the bootstrap's multiaddr,
    # and falls back to its ZeroMQ rendezvous (also in `bootstrap`) if the libp2p daemon cannot start.
    island = p2p_diloco.join(
        model, optimizer, scheduler, bootstrap=bootstrap, run_id="own-loop", run_dir=workdir / f"island-{index}",
        diloco=DiLoCoConfig(local_steps=20),  # H: ~20 steps of this model is well under a second
        island=IslandConfig(name=f"island-{index}", max_seconds=seconds, wait_for=islands, quiet=True),
        eval_fn=held_out_loss)  # shown by `p2p-diloco status` and the dashboard
    for sig in (signal.SIGINT, signal.SIGTERM):  # end the round, checkpoint and leave cleanly
        signal.signal(sig, lambda *_: island.stop())
    with island:
        last_report = time.monotonic()
        while not island.done:
            x, y = sample(train, gen)
            loss = loss_on(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            island.step(loss=loss, tokens=x.numel())
            if time.monotonic() - last_report >= 10:
                f = island.figures()
                print(f"[island-{index}] round {f['round']:>4} v{f['version']:<4} loss {f['loss']:.3f} "
                      f"mixes {f['mixes']:>3} partner {(f['partner'] or '-')[:8]}", file=sys.stderr, flush=True)
                last_report = time.monotonic()
    summary = island.close()  # already closed by `with`: returns the same summary
    return {"loss_start": loss_start, "loss_end": held_out_loss(), "mixes": summary["mixes"],
            "rounds": summary["rounds"], "tokens": summary["tokens"], "bytes_in": summary["bytes_in"]}


# -- the launcher: a bootstrap node and the islands as child processes -----------------------------
def spawn(args: list[str], stdout=subprocess.DEVNULL, stderr=None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # own session: Ctrl+C reaches only this launcher, which then stops the children itself
    return subprocess.Popen(args, stdout=stdout, stderr=stderr, env=env, start_new_session=True)


def start_bootstrap(workdir: Path, procs: list[subprocess.Popen], timeout: float = 60.0) -> list[str]:
    """`p2p-diloco bootstrap` on 127.0.0.1, any free port; returns the addresses it writes."""
    addr_file = workdir / "bootstrap.addr"
    procs.append(spawn([sys.executable, "-m", "p2p_diloco", "bootstrap", "--host", "127.0.0.1", "--port", "0",
                        "--identity", str(workdir / "bootstrap.key"), "--addr-file", str(addr_file)],
                       stderr=open(workdir / "bootstrap.log", "w")))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and procs[-1].poll() is None:
        if addr_file.exists():
            return addr_file.read_text().split()
        time.sleep(0.2)
    raise RuntimeError(f"the bootstrap node did not start; see {workdir / 'bootstrap.log'}")


def stop_all(procs: list[subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM each child (islands leave cleanly), then SIGKILL its whole group after `grace` seconds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl+C must not leave children behind
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # and the helpers it started (the libp2p daemon)
        except ProcessLookupError:
            pass
        p.wait()


def launch(args: argparse.Namespace) -> list[dict]:
    """Start the bootstrap node and the islands, wait for them; returns each island's result."""
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="own-loop-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir} (metrics, checkpoints, the bootstrap's log)", file=sys.stderr)
    procs: list[subprocess.Popen] = []
    try:
        boot = [a for addr in start_bootstrap(workdir, procs) for a in ("--bootstrap", addr)]
        islands = [spawn([sys.executable, __file__, "--island", str(i), "--islands", str(args.islands),
                          "--seconds", str(args.seconds), "--workdir", str(workdir), *boot],
                         stdout=open(workdir / f"island-{i}.json", "w"))
                   for i in range(args.islands)]
        procs += islands
        for i, p in enumerate(islands):  # the islands stop themselves after `seconds`
            code = p.wait(timeout=args.seconds + 180)  # plus start-up, the last checkpoint and evaluation
            if code != 0:
                raise RuntimeError(f"island {i} exited with code {code} (its log is above, on stderr)")
    finally:
        stop_all(procs)
    return [json.loads((workdir / f"island-{i}.json").read_text().splitlines()[-1]) for i in range(args.islands)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--islands", type=int, default=2, help="islands to start (default 2)")
    parser.add_argument("--seconds", type=float, default=60.0, help="training time of each island (default 60)")
    parser.add_argument("--workdir", default=None, help="metrics, checkpoints, the bootstrap's log (default: a new temp folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument("--island", type=int, default=None, help=argparse.SUPPRESS)  # the island role
    parser.add_argument("--bootstrap", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.island is not None:
        print(json.dumps(run_island(args.island, args.bootstrap, args.seconds, args.islands, Path(args.workdir))))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as Ctrl+C: `launch` stops the children first
    try:
        results = launch(args)
    except KeyboardInterrupt:
        sys.exit(130)
    if args.json:
        print(json.dumps({"islands": [{k: r[k] for k in ("loss_start", "loss_end", "mixes")} for r in results]}))
        return
    for i, r in enumerate(results):
        print(f"island-{i}: held-out loss {r['loss_start']:.3f} -> {r['loss_end']:.3f} "
              f"(ln 256 = {math.log(256):.3f}), {r['rounds']} rounds, {r['mixes']} partner states mixed, "
              f"{r['tokens']:,} tokens, {r['bytes_in'] / 1e6:.1f} MB fetched")


if __name__ == "__main__":
    main()
