"""`p2p-diloco bench round`: what one gossip round costs an island beyond its inner steps, by model size.

For each size, one fresh process (so one size's freed memory does not blur the next one's peak)
builds an island as `p2p-diloco join` has it between two rounds: a GPT, its gradients, its AdamW
state (one real step on a tiny batch), and a partner whose state a second `SnapshotServer`
already serves over loopback. Then it runs what the island's round adds to its inner steps, with
the default `NetworkConfig` (int8) and `DiLoCoConfig`, each piece timed alone:

- `snapshot_s`: `Publisher.publish()` on the training thread: the copy of what is published
  (`snapshot_copies` states: the anchor, and the momentum when it travels unencoded) into the
  publisher's host buffers, the rest handed to its publishing thread;
- `publish_s`: that thread's work, waited for (`Publisher.flush`): finiteness check, int8 encoding,
  digests, served from now on (in an island, overlapped with the next round's inner steps);
- `fetch_s`: a `Fetcher`'s fetch of the partner's state: transfer and checks (block digests, finite
  int8 scales), kept encoded (`decode=False`), as the island's gossip worker (`peers/gossip/worker.py`) does;
- `measure_s`: the worker's measure of it against the anchor (`peers.gossip.measure.measure`: its
  distances, norms and the sketch of its move, `peers.admission.drift`), in one pass;
- `mix_s`: `partner_state(...)` and `OuterLoop.mix_arrived(...)`: decoding the partner slice by slice
  into fp32 and mixing it into the anchor and the running weights;
- `outer_s`: `OuterLoop.end_round([])`: the outer Nesterov step and loading the new anchor.

`blocked_s` is what a round's end costs the training thread, `snapshot_s + outer_s` (the mix runs
between two inner steps when a partner's state arrived, `peers.rounds.schedule`, and is `mix_s` apart);
`background_s`, `publish_s + fetch_s + measure_s`, runs on the island's other threads. The target:
`blocked_s` at most `outer_s` plus `snapshot_copies` clones of the state. `overhead_s` is the sum
of every piece, wherever it runs.

Apart from the round, after its memory was measured: `probe_s`, the probe of a partner's mix
(`peers.admission.probe`), against `step_s`, one inner step, both on one sequence of the model's block
(`probe_vs_step`: a mix's probe in inner steps, since a probe batch and a training batch both hold
16 sequences).

The rounds are those of an island many rounds in (`steady_chain`): one untimed publish first and,
for an exchange with a public state, as many updates as the island keeps (their memory is up to
the fp32 public state's bytes again, `core.public`); the first timed rounds still fault in fresh
pages (the server's second snapshot), so each piece is the median of `repeat` rounds
(re-published and re-fetched every time); `clone_s`, one
`phi.clone()` of the fp32 anchor (median of 3, a fresh clone each time), is the yardstick: a
round's overhead is judged in copies of the state.

Memory: the baseline is the RSS with model, gradients, AdamW state and the partner's server in
place. The kernel's peak counter is reset there (`/proc/self/clear_refs`), then the island's
`OuterLoop` and server are built and the rounds run; `peak_extra_bytes` is the highest VmHWM
minus the baseline over all of them. Where clear_refs is refused, a thread samples the RSS every millisecond instead and the
row says `"peak_method": "sampled"`. The counter is also reset between pieces, so the details
(stderr) say which piece holds the peak, and the later rounds' peaks show the steady state (from
the second publish on, the island's server also holds its previous snapshot, `retain_snapshots`).

Model sizes follow GPT-2's proportions (`model_shape`): head size 64 and as many layers as heads.

`--device cuda` builds the island there (as `join --device cuda` does): each piece is timed up to a
`torch.cuda.synchronize`, and the row adds `device_peak_extra_bytes`, the most CUDA memory the
island's tensors held above the baseline (`torch.cuda.max_memory_allocated`); `peak_extra_bytes`
stays the host's.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
from typing import Any, Callable

from p2p_diloco.bench.memory import PeakMeter
from p2p_diloco.bench.yardsticks import clone_seconds, probe_cost, timed

DEFAULT_PARAMS = (1_000_000, 12_000_000, 124_000_000)
"""Model sizes measured by default: the tiny demo model's order, 10x that, GPT-2 small."""
GPT2_VOCAB, GPT2_BLOCK = 50257, 1024
"""GPT-2's vocabulary and context: with n_embd 768 and 12 layers, its 124M-parameter model exactly."""
BYTE_BLOCK = 256
"""Context of the byte-vocabulary models below `GPT2_FROM` (the vocabulary is the 256 byte values)."""
GPT2_FROM = 50_000_000
"""From this many parameters up the model uses GPT-2's vocabulary; below it, bytes (a 50257-row
embedding would otherwise be most of a small model)."""
ROUND_TOKENS = 15 * 16 * 128
"""Tokens one default round trains on (H=15 steps of 16 x 128): the partner's and the island's counters."""
REPEAT = 5
"""Rounds timed per size (the median of each piece is reported)."""
FETCH_TIMEOUT_S = 60.0
"""A benchmark fetch that hears nothing for this long fails."""
SIZE_RUN_S = 1800.0
"""Limit of the fresh process that measures one size."""
TARGET_OVERHEAD_VS_CLONE, TARGET_PEAK_VS_STATE, TARGET_FLATNESS, PUBLIC_STATE_PEAK = 12.0, 3.25, 2.0, 2.25
"""Targets at the largest size: overhead at most 12 clones of the state; peak extra memory at most
3.25 states: anchor and momentum, the partner's state as it travelled (int8 weights, int4
momentum: 0.39 of a state), and the island's two served snapshots of as much (the previous one
finishes the fetches that started on it), where the issue's 3 was set before the momentum
travelled; 2.25 more for an exchange that keeps a public state: itself, one fp32 copy of the
weights, the updates it keeps for partners behind, up to its bytes again (`core.public`), and the
next update while the oldest is dropped (BENCHMARKS.md, "Cost of a round against model size"); plus
one for each state the snapshot copies (`snapshot_copies`: the publisher's host buffers, reused every
round, the price of a round's end that does not wait for the encoding; BENCHMARKS.md, "Every second
trains"); and
overhead per parameter "roughly flat", read as: the largest and smallest ns/param of the sizes
measured within a factor of 2."""
PIECES = ("snapshot", "publish", "fetch", "measure", "mix", "outer")


def layer_params(n_embd: int) -> int:
    """Parameters of one `Block` of `p2p_diloco.core.model.GPT`: qkv, proj, fc, proj (no biases), two LayerNorms."""
    return 12 * n_embd * n_embd + 4 * n_embd


def shape_params(shape: dict[str, int]) -> int:
    """Trainable parameters of `GPT(**shape)` (tied head: the token embedding counts once)."""
    d = shape["n_embd"]
    return shape["n_layer"] * layer_params(d) + (shape["vocab_size"] + shape["block_size"] + 2) * d


def model_shape(params: int) -> dict[str, int]:
    """A GPT shape with about `params` trainable parameters, by GPT-2's proportions.

    Rule: the vocabulary is GPT-2's (block 1024) from `GPT2_FROM` parameters up, else bytes
    (block 256). n_embd is the multiple of 64 whose GPT-2-shaped model (n_head = n_layer =
    n_embd / 64) is closest to `params` in ratio; n_layer is then the whole number of layers that
    brings the count closest to `params`. 124M gives GPT-2 small (768 wide, 12 layers, 12 heads).
    """
    vocab, block = (GPT2_VOCAB, GPT2_BLOCK) if params >= GPT2_FROM else (256, BYTE_BLOCK)

    def gpt2_like(k: int) -> dict[str, int]:
        return {"n_layer": k, "n_head": k, "n_embd": 64 * k, "block_size": block, "vocab_size": vocab}

    k = min(range(1, 65), key=lambda k: abs(math.log(shape_params(gpt2_like(k)) / params)))
    shape = gpt2_like(k)
    embed = shape_params({**shape, "n_layer": 0})
    shape["n_layer"] = max(1, round((params - embed) / layer_params(shape["n_embd"])))
    return shape


def build_island(shape: dict[str, int], device: Any = "cpu") -> tuple[Any, Any]:
    """A GPT with gradients and AdamW state on `device`, as an island holds them between two inner steps."""
    import torch

    from p2p_diloco.config import TrainConfig
    from p2p_diloco.core.inner import make_optimizer
    from p2p_diloco.core.model import GPT

    torch.manual_seed(0)
    model = GPT(**shape, dropout=0.0).to(device)
    optimizer = make_optimizer(model, TrainConfig())
    x = torch.randint(shape["vocab_size"], (1, 33), device=device)  # batch 1, block 32
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    optimizer.step()  # AdamW's two moments now exist; the gradients stay
    return model, optimizer


def serve_partner(model: Any, network: Any, fp: str) -> Any:
    """A second server publishing a perturbed copy of the model's weights as the partner's state."""
    from p2p_diloco.core.params import ParamSlices
    from p2p_diloco.exchange.server import SnapshotServer

    server = SnapshotServer(config=network)
    phi = ParamSlices(model).gather("cpu").mul_(1.001)
    server.publish({"phi": phi}, version=0, tokens=ROUND_TOKENS, meta={"peer_id": "partner", "model": fp})
    return server


def one_round(outer: Any, publisher: Any, endpoint: str, network: Any, fp: str, meter: PeakMeter) -> dict:
    """Publish, fetch, mix, outer step, as an island's round does after its inner steps: each
    piece's seconds and its peak memory above the baseline."""
    from p2p_diloco.core.device import synchronize
    from p2p_diloco.peers.gossip.worker import partner_state
    from p2p_diloco.peers.gossip.measure import measure as measure_state

    numel = outer.state.phi.numel()
    sync = functools.partial(synchronize, outer.state.phi.device)
    seconds, peaks = {}, {}

    def mark(piece: str, s: float) -> None:
        seconds[piece], peaks[piece] = s, meter.take()

    mark("snapshot", timed(lambda: publisher.publish(publish_parts(publisher.exchange)), sync)[1])
    mark("publish", timed(publisher.flush, sync)[1])  # (the publishing thread's: overlapped in an island)
    snap, s = timed(lambda: fetch_encoded(endpoint, network), sync)
    mark("fetch", s)
    mark("measure", timed(lambda snap=snap: measure_state(outer.state.phi, snap.tensors["phi"], outer.state.m,
                                                          snap.tensors.get("m")), sync)[1])
    weight, s = timed(lambda snap=snap: outer.mix_arrived(partner_state(snap, numel, fp)), sync)
    assert weight > 0, "the partner must be mixed, or mix_s would time nothing"
    del snap  # mixed: the island keeps nothing of it
    mark("mix", s)
    mark("outer", timed(lambda: outer.end_round([], tokens=ROUND_TOKENS), sync)[1])
    return {"seconds": seconds, "peaks": peaks}


def publish_parts(exchange: Any) -> int:
    """The fragments of the updates the measured island publishes: its exchange's (`auto`: whole
    updates, its costliest publish and the most bytes it keeps)."""
    return 1 if exchange.adaptive else exchange.fragments


def steady_chain(publisher: Any) -> int:
    """A first publish, untimed, and for an exchange with a public state as many updates as it keeps
    (the same anchor each time: an update's bytes do not depend on its values), so that the timed
    rounds and their peak are those of an island many rounds in; the updates kept."""
    parts = publish_parts(publisher.exchange)
    publisher.publish(parts, wait=True)
    public = publisher.public_side.public
    if public is None:
        return 0
    while True:
        kept = len(public.updates)
        public.advance(publisher.outer.state.phi, parts)
        if len(public.updates) <= kept:
            return kept


def snapshot_copies(publisher: Any) -> int:
    """States the round's snapshot copies (`Publisher.tensors`: the anchor, and the momentum when it
    travels unencoded): `blocked_s`'s yardstick is the outer step plus this many clones."""
    from p2p_diloco.core.codecs import EncodedVector

    return sum(not isinstance(x, EncodedVector) for x in publisher.tensors().values())


def fetch_encoded(endpoint: str, network: Any) -> Any:
    """The partner's state over a fresh connection, checked but kept encoded, as the gossip worker fetches it."""
    from p2p_diloco.exchange.client import Fetcher

    with Fetcher(endpoint, network) as fetcher:
        return fetcher.fetch(FETCH_TIMEOUT_S, decode=False)


def measure(params: int, threads: int = 1, repeat: int = REPEAT, exchange: str = "state",
            device: str = "cpu") -> dict[str, Any]:
    """One size in this process on `device`, its island publishing as `exchange` has it: the row of the JSON
    output plus `details` (shape, every round, peaks)."""
    import torch

    from p2p_diloco.config import DiLoCoConfig, NetworkConfig
    from p2p_diloco.core.device import peak_memory_bytes, reset_peak_memory, resolve_device
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.core.params import fingerprint
    from p2p_diloco.exchange.server import SnapshotServer
    from p2p_diloco.peers.identity import Identity
    from p2p_diloco.peers.gossip.publishing import Publisher

    torch.set_num_threads(threads)
    network, diloco, shape = NetworkConfig(), DiLoCoConfig(exchange=exchange), model_shape(params)
    where = resolve_device(device)
    model, optimizer = build_island(shape, where)  # its state stays alive through the measurement, as an island's
    fp = fingerprint(model)
    partner = serve_partner(model, network, fp)
    gc.collect()
    device_baseline = reset_peak_memory(where)
    meter = PeakMeter()
    try:
        outer = OuterLoop("island", model, diloco)
        server = SnapshotServer(config=network)
        setup_peak = meter.take()
        publisher = Publisher(server, outer, exchange_mode(diloco.exchange, diloco.update_codec, diloco.fragments),
                              Identity("island", "island", fp, ""))
        kept = steady_chain(publisher)
        rounds = [one_round(outer, publisher, partner.endpoint, network, fp, meter) for _ in range(repeat)]
        clone_s = clone_seconds(outer.state.phi)
        server.close()
    finally:
        meter.close()
        partner.close()
    n = outer.slices.numel
    details = {"shape": shape, "threads": threads, "baseline_rss_bytes": meter.baseline, "kept_updates": kept,
               "peaks": {"outer_loop": setup_peak, **rounds[0]["peaks"]}, "rounds": rounds}
    peak = max([setup_peak, *(v for r in rounds for v in r["peaks"].values())])  # the steady state's rounds too
    row = {"exchange": exchange, "device": str(where), **_row(n, clone_s, rounds, peak, snapshot_copies(publisher)),
           **probe_cost(model, optimizer, outer, shape)}  # (after the memory was measured)
    if device_baseline is not None:
        row["device_peak_extra_bytes"] = peak_memory_bytes(where) - device_baseline
    if meter.method != "clear_refs":
        row["peak_method"] = meter.method
    return {**row, "details": details}


def _row(params: int, clone_s: float, rounds: list[dict], peak: int, copies: int) -> dict[str, Any]:
    """The JSON row: medians of each piece, their sum, and the ratios the targets are stated in."""
    piece = {p: statistics.median(r["seconds"][p] for r in rounds) for p in PIECES}
    overhead = sum(piece.values())
    state = 4 * params
    return {"params": params, "state_bytes": state, "clone_s": clone_s,
            **{f"{p}_s": piece[p] for p in PIECES}, "overhead_s": overhead,
            "blocked_s": piece["snapshot"] + piece["outer"],
            "background_s": piece["publish"] + piece["fetch"] + piece["measure"],
            "snapshot_copies": copies, "peak_extra_bytes": peak,
            "overhead_per_param_ns": overhead / params * 1e9, "overhead_vs_clone": overhead / clone_s,
            "peak_extra_vs_state": peak / state}


def run_round(params: list[int] | tuple[int, ...] = DEFAULT_PARAMS, threads: int = 1, repeat: int = REPEAT,
              log: Callable[[str], None] | None = None, exchanges: tuple[str, ...] = ("state",),
              device: str = "cpu") -> dict[str, Any]:
    """Each size, for each exchange, measured in a fresh process on `device`: `{"rows": [...]}` (details to `log`)."""
    say, env, rows = log or (lambda msg: None), dict(os.environ, OMP_NUM_THREADS=str(threads)), []
    for exchange, n in ((e, n) for e in exchanges for n in params):
        out = subprocess.run([sys.executable, "-m", "p2p_diloco.bench.round", str(n), "--threads", str(threads),
                              "--repeat", str(repeat), "--exchange", exchange, "--device", device], env=env,
                             capture_output=True, text=True, timeout=SIZE_RUN_S)
        if out.returncode:
            raise RuntimeError(f"measuring {n} parameters failed: {out.stderr[-2000:]}")
        row = json.loads(out.stdout.splitlines()[-1])
        _say_details(row.pop("details"), row["params"], say)
        rows.append(row)
    return {"rows": rows}


def _say_details(d: dict, params: int, say: Callable[[str], None]) -> None:
    mib = 2**20
    say(f"{params:,} params {d['shape']}, {d['threads']} thread(s), "
        f"baseline RSS {d['baseline_rss_bytes'] / mib:.0f} MiB")
    say("  peak above baseline, MiB: " + ", ".join(f"{k} {v / mib:.1f}" for k, v in d["peaks"].items()))
    for k, r in enumerate(d["rounds"]):
        say(f"  round {k} s: " + ", ".join(f"{p} {r['seconds'][p]:.4f}" for p in PIECES)
            + f"; its peak {max(r['peaks'].values()) / mib:.1f} MiB")


def targets(rows: list[dict]) -> list[tuple[str, float, float, bool]]:
    """(what, measured, limit, met) for the targets (module constants), judged at the largest size, for
    each exchange measured."""
    out = []
    for exchange in dict.fromkeys(r["exchange"] for r in rows):
        out += _targets([r for r in rows if r["exchange"] == exchange], exchange)
    return out


def _targets(rows: list[dict], exchange: str) -> list[tuple[str, float, float, bool]]:
    big = max(rows, key=lambda r: r["params"])
    per_param = [r["overhead_per_param_ns"] for r in rows]
    flat = max(per_param) / min(per_param)
    from p2p_diloco.core.modes import exchange_mode  # (torch: imported when judging, not at start-up)
    keeps_public = exchange_mode(exchange, "sign").updates  # (its public state, and the updates it keeps)
    at = f"at {big['params'] / 1e6:.1f}M, {exchange}"
    peak = TARGET_PEAK_VS_STATE + big["snapshot_copies"] + PUBLIC_STATE_PEAK * keeps_public
    blocked_limit = big["outer_s"] + big["snapshot_copies"] * big["clone_s"]
    return [(f"blocked_s (s) {at}, at most outer_s + {big['snapshot_copies']} clone_s", big["blocked_s"], blocked_limit,
             big["blocked_s"] <= blocked_limit),
            (f"overhead_s / clone_s {at}", big["overhead_vs_clone"], TARGET_OVERHEAD_VS_CLONE,
             big["overhead_vs_clone"] <= TARGET_OVERHEAD_VS_CLONE),
            (f"peak_extra_bytes / state_bytes {at}", big["peak_extra_vs_state"], peak, big["peak_extra_vs_state"] <= peak),
            (f"max / min overhead_per_param_ns over the sizes, {exchange}", flat, TARGET_FLATNESS,
             flat <= TARGET_FLATNESS)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m p2p_diloco.bench.round",
                                description="Measure one size in this process; print its row as JSON.")
    p.add_argument("params", type=int)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=REPEAT)
    p.add_argument("--exchange", default="state")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    print(json.dumps(measure(a.params, a.threads, a.repeat, a.exchange, a.device)), flush=True)


if __name__ == "__main__":
    main()
