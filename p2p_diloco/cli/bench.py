"""`p2p-diloco bench transport|swarm|round|shard|attack|links|gpu`: the measurements BENCHMARKS.md quotes, each printed by one command."""

from __future__ import annotations

import json
from pathlib import Path

import click

from p2p_diloco.bench.links import SCENARIOS as LINK_SCENARIOS
from p2p_diloco.bench.round import DEFAULT_PARAMS, GPT2_VOCAB
from p2p_diloco.cli.join import join, run_join
from p2p_diloco.cli.options import codec_option, csv, device_spec, echo_result, user_errors
from p2p_diloco.choices import HONEST_MEMBERS, POISONS
from p2p_diloco.config import (
    EXCHANGES, MODEL_PRESETS, MOMENTUM_MODES, PRECISIONS, UPDATE_CODECS, WIRE_CODECS, DiLoCoConfig, TrainConfig
)
from p2p_diloco.sim.config import SimConfig


@click.group()
def bench() -> None:
    """Measure parts of the system and print the figures quoted in BENCHMARKS.md."""


@bench.command("transport")
@click.option("--params", type=click.IntRange(1, 2_000_000_000), default=50_000_000, show_default=True,
              help="fp32 values in the published state (50M = 200 MB).")
@click.option("--compression", type=click.Choice(WIRE_CODECS), default="fp32", show_default=True,
              help="Payload codec (sign: what a public state's update travels in).")
@click.option("--latency-ms", type=click.FloatRange(0, 10_000), default=0.0, show_default=True,
              help="Emulated one-way latency for an extra, emulated fetch.")
@click.option("--bandwidth-mbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Emulated link rate in Mbit/s for an extra, emulated fetch.")
@click.option("--repeat", type=click.IntRange(1, 20), default=5, show_default=True, help="Timed runs (best is reported).")
@click.option("--raw", type=click.Choice(["message", "stream"]), default="message", show_default=True,
              help="Bare ZeroMQ reference: one whole-buffer message, or a pipelined stream of 4 MiB frames.")
@click.option("--secret", default=None, help="Swarm secret for the protocol runs (CurveZMQ).")
@click.option("--memory/--no-memory", default=True, show_default=True,
              help="Also measure the fetcher's peak extra memory in a fresh process.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout; details go to stderr.")
def bench_transport(params, compression, latency_ms, bandwidth_mbps, repeat, raw, secret, memory, as_json):
    """State transfer between two processes on 127.0.0.1 against bare ZeroMQ in the same run."""
    from p2p_diloco.bench.transport import run

    with user_errors():
        out = run(params, compression, latency_ms, bandwidth_mbps, repeat=repeat, raw=raw, secret=secret,
                  memory=memory, log=lambda msg: click.echo(msg, err=True))
    out.pop("details")
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{out['bytes']} bytes in {out['fetch_s']:.3f} s: {out['bytes_per_s'] / 1e6:.1f} MB/s, "
               f"bare ZeroMQ {out['raw_zmq_bytes_per_s'] / 1e6:.1f} MB/s, ratio {out['ratio_to_raw']:.3f}")
    if out["emulated"]:
        e = out["emulated"]
        click.echo(f"emulated {e['latency_ms']} ms / {e['bandwidth_mbps']} Mbit/s: end-to-end {e['bytes_per_s'] / 1e6:.1f} "
                   f"MB/s, link utilization {e['link_utilization']}")


@bench.command("swarm")
@click.option("--islands", "-k", type=click.IntRange(2, 16), default=SimConfig.islands, show_default=True)
@click.option("--tokens", type=int, default=SimConfig.tokens, show_default=True, help="Total tokens over all islands.")
@click.option("--latency-ms", type=float, default=SimConfig.latency_ms, show_default=True, help="Emulated one-way latency.")
@click.option("--bandwidth-mbps", default=str(SimConfig.bandwidth_mbps), show_default=True, callback=csv(float),
              help="Emulated uplink, Mbit/s: one for every island, or one per island (1000,1000,0.5,0.5).")
@codec_option(SimConfig.compression)
@click.option("--local-steps", "-H", type=int, default=DiLoCoConfig.local_steps, show_default=True, help="H (the join default).")
@click.option("--momentum", type=click.Choice(MOMENTUM_MODES), default=DiLoCoConfig.momentum, show_default=True,
              help="The islands' and the simulation's momentum mode (as `join --momentum`).")
@click.option("--exchange", type=click.Choice(EXCHANGES), default=DiLoCoConfig.exchange, show_default=True,
              help="Whole states or public-state updates (as `join --exchange`; the simulation's partners are then a ring).")
@click.option("--update-codec", type=click.Choice(UPDATE_CODECS), default=DiLoCoConfig.update_codec,
              show_default=True, help="Codec of the updates (as `join`'s [diloco] update_codec).")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Run the swarm this many times and report the mean loss (the simulations run once).")
@click.option("--eval-batches", type=click.IntRange(min=1), default=SimConfig.eval_batches, show_default=True,
              help="Held-out batches every loss is evaluated on (the simulations' and the swarm's checkpoints').")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the islands' files here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_swarm(islands, tokens, latency_ms, bandwidth_mbps, compression, local_steps, momentum, exchange,
                update_codec, runs, eval_batches, workdir, as_json) -> None:
    """Real islands on loopback over an emulated WAN, against the simulator and data parallel."""
    from p2p_diloco.bench.swarm import run_bench_swarm

    if len(bandwidth_mbps) not in (1, islands) or min(bandwidth_mbps, default=0) <= 0:
        raise click.BadParameter(f"one rate > 0, or {islands} of them (--islands); got {bandwidth_mbps}",
                                 param_hint="--bandwidth-mbps")
    bandwidth_mbps = bandwidth_mbps[0] if len(bandwidth_mbps) == 1 else bandwidth_mbps
    out = run_bench_swarm(islands, tokens, latency_ms, bandwidth_mbps, compression, local_steps,
                          Path(workdir) if workdir else None, runs, momentum, exchange, update_codec, eval_batches)
    if as_json:
        click.echo(json.dumps(out))
        return
    for k, v in out.items():
        if k != "per_run":
            click.echo(f"{k:>24}: {v}")
    for k, r in enumerate(out["per_run"]):
        click.echo(f"{'run ' + str(k):>24}: eval loss {r['swarm_eval_loss']:.4f} (x{r['ratio_to_dp']:.4f} dp), islands "
                   f"{', '.join(f'{x:.4f}' for x in r['per_island_eval_loss'])}, utilization "
                   f"{min(r['utilization']):.3f}-{max(r['utilization']):.3f} (net of the probe "
                   f"{min(r['net_utilization']):.3f}-{max(r['net_utilization']):.3f}), {r['bytes_moved']:,} bytes, "
                   f"{r['workdir']}")


def _param_count(text: str) -> int:
    """A model size as an int or a float like 124e6, within what `bench round` can build and hold."""
    x = float(text)
    if not x.is_integer() or not 1e4 <= x <= 2e9:
        raise ValueError(f"{text!r} is not a whole number of parameters between 1e4 and 2e9")
    return int(x)


@bench.command("round")
@click.option("--params", default=",".join(map(str, DEFAULT_PARAMS)), show_default=True, callback=csv(_param_count),
              help="Model sizes (trainable parameters, comma-separated, 124e6 allowed); each runs in its own process.")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True,
              help="torch threads of the measuring process (an island process runs with one).")
@click.option("--exchange", "exchanges", default=",".join(EXCHANGES), show_default=True, callback=csv(str),
              help="Exchanges to measure, a row each: what the island publishes (auto and updates: its public "
                   "state's update too); the fetch and mix are of a whole state in every row.")
@click.option("--device", default="cpu", show_default=True, callback=device_spec, metavar="DEVICE",
              help="Where the island's model, optimizer and outer state live (cuda: the row adds its peak there).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout; details go to stderr.")
def bench_round(params, threads, exchanges, device, as_json) -> None:
    """What one gossip round (publish, fetch, mix, outer step) costs an island, against model size."""
    from p2p_diloco.bench.round import run_round, targets
    from p2p_diloco.core.device import resolve_device

    if not params:
        raise click.BadParameter("give at least one size", param_hint="--params")
    if not exchanges or set(exchanges) - set(EXCHANGES):
        raise click.BadParameter(f"choose from {', '.join(EXCHANGES)}", param_hint="--exchange")
    with user_errors():
        resolve_device(device)  # a device that is not here: one line, before any process starts
        out = run_round(params, threads, log=lambda msg: click.echo(msg, err=True), exchanges=tuple(exchanges),
                        device=device)
    if as_json:
        click.echo(json.dumps(out))
        return
    _round_table(out["rows"])
    for what, value, limit, met in targets(out["rows"]):
        click.echo(f"target {what}: {value:.2f} <= {limit:g}: {'met' if met else 'MISSED'}")


def _round_table(rows: list[dict]) -> None:
    """The rows of `bench round` as a table: seconds, MiB, and the ratios the targets use."""
    head = ("exchange", "params", "state MiB", "clone_s", "snapshot_s", "publish_s", "fetch_s", "mix_s", "outer_s",
            "blocked_s", "overhead_s",
            "peak MiB", "ns/param", "x clone", "x state")
    widths = [8, 13, *(max(len(h), 9) for h in head[2:])]
    click.echo(" ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in rows:
        cells = [r["exchange"], f"{r['params']:,}", f"{r['state_bytes'] / 2**20:.1f}",
                 *(f"{r[k]:.4f}" for k in ("clone_s", "snapshot_s", "publish_s", "fetch_s", "mix_s", "outer_s",
                                           "blocked_s", "overhead_s")),
                 f"{r['peak_extra_bytes'] / 2**20:.1f}", f"{r['overhead_per_param_ns']:.2f}",
                 f"{r['overhead_vs_clone']:.2f}", f"{r['peak_extra_vs_state']:.2f}"]
        click.echo(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))


@bench.command("shard")
@click.option("--preset", type=click.Choice(list(MODEL_PRESETS)), default="small", show_default=True,
              help="The GPT's shape (over bytes).")
@click.option("--ranks", type=click.IntRange(2, 64), default=2, show_default=True, help="Processes of the island.")
@click.option("--steps", type=click.IntRange(1, 1000), default=4, show_default=True, help="Inner steps per round.")
@click.option("--rounds", type=click.IntRange(1, 100), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 1024), default=4, show_default=True, help="Sequences per step and rank.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout; details go to stderr.")
def bench_shard(preset, ranks, steps, rounds, batch_size, as_json) -> None:
    """Memory per rank of a torchrun island (gloo, CPU), its model replicated (DDP) or sharded (FSDP2)."""
    from p2p_diloco.bench.shard import run_shard

    with user_errors():
        out = run_shard(preset, ranks, steps, rounds, batch_size, log=lambda msg: click.echo(msg, err=True))
    if as_json:
        click.echo(json.dumps(out))
        return
    keys = ("param_bytes", "grad_bytes", "optimizer_bytes", "outer_bytes", "full_copy_bytes", "held_bytes",
            "setup_peak_bytes", "train_peak_bytes", "peak_rss_bytes")
    click.echo(f"{'way':>9} {'rank':>4} " + " ".join(f"{k.removesuffix('_bytes') + ' MiB':>16}" for k in keys)
               + f" {'step_s':>7} {'end_s':>7}")
    for report in out.values():
        for r in report["rows"]:
            click.echo(f"{r['way']:>9} {r['rank']:>4} " + " ".join(f"{r[k] / 2**20:>16.1f}" for k in keys)
                       + f" {r['step_s']:>7.3f} {r['round_end_s']:>7.3f}")


@bench.command("attack")
@click.option("--kinds", default=",".join(POISONS + HONEST_MEMBERS), show_default=True, callback=csv(str),
              help="The member beside the honest islands, one swarm each: a poison it publishes (nan, scale, "
                   "random, other-run, momentum, inflate, stuck, reverse, noise, claims, momentum-x3, drift, alie, ipm) or an "
                   "honest difference (slow: 10x slower; other-data: trained on another corpus).")
@click.option("--honest", type=click.IntRange(2, 8), default=3, show_default=True, help="Honest islands.")
@click.option("--members", type=click.IntRange(1, 4), default=1, show_default=True,
              help="Members of each kind in one swarm (several drift members collude on one direction).")
@click.option("--tokens", type=click.IntRange(min=1), default=368_640, show_default=True,
              help="Tokens every island trains in every swarm (a slow member a tenth of them).")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Swarms of each kind, and as many without the member: judged on their mean.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the runs here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_attack(kinds, honest, members, tokens, runs, workdir, as_json) -> None:
    """Honest islands with one more member, hostile (a test double) or honestly different, against
    the same swarm without it."""
    from p2p_diloco.bench.attack import run_bench_attack
    known = POISONS + HONEST_MEMBERS
    unknown = sorted(set(kinds) - set(known))
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}", param_hint="--kinds")
    with user_errors():
        out = run_bench_attack(tuple(kinds), honest, tokens, workdir=Path(workdir) if workdir else None, runs=runs, members=members)
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"without the member, {runs} run(s): mean eval loss {out['clean_mean']:.4f} (spread of the runs' "
               f"means {out['clean_spread']:.2%}, worst island x{out['clean_worst_ratio_to_clean_mean']:.4f}); honest "
               f"states refused {out['clean_false_refusals']} of {out['clean_false_refusals'] + out['clean_mixes']}")
    for kind, a in out["attacks"].items():
        click.echo(f"{kind:>11}: mean eval loss {a['mean']:.4f}, x{a['ratio_to_clean_mean']:.4f} of the clean mean "
                   f"(worst island x{a['worst_ratio_to_clean_mean']:.4f}, spread {a['spread']:.2%}, {a['diverged']} "
                   f"roll-backs); the member's states refused {a['member_states_refused']}, mixed "
                   f"{a['member_states_mixed']} (bounded {a['member_mixes_bounded']})")


@bench.command("links")
@click.option("--scenarios", default=",".join(LINK_SCENARIOS), show_default=True, callback=csv(str),
              help="Link events, one swarm each: fast (every link fast), slow-uplink (one island's uplink at 0.5 "
                   "Mbit/s), drop (one island's link down for the middle 40% of the run), partition (two halves "
                   "cut apart for the middle 40%).")
@click.option("--islands", type=click.IntRange(2, 16), default=4, show_default=True,
              help="Islands, each on a host (a network namespace) of its own.")
@click.option("--tokens", type=click.IntRange(min=1), default=368_640, show_default=True,
              help="Tokens every island trains in every swarm.")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True, help="Swarms of each scenario.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the runs here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_links(scenarios, islands, tokens, runs, workdir, as_json) -> None:
    """Islands on hosts of their own (network namespaces, tc rate limits) while links slow down, go
    down and split: eval loss, mixes and refusals before, during and after, and rounds to recover.
    Needs root, ip, tc and iptables."""
    from p2p_diloco.bench.links import run_bench_links, table
    from p2p_diloco.bench.netns import iptables_binary

    unknown = sorted(set(scenarios) - set(LINK_SCENARIOS))
    if unknown or not scenarios:
        raise click.BadParameter(f"unknown {', '.join(unknown) or 'none given'}; choose from "
                                 f"{', '.join(LINK_SCENARIOS)}", param_hint="--scenarios")
    binary, reason = iptables_binary()
    if binary is None:
        raise click.ClickException(f"bench links needs root, ip, tc and iptables: {reason}")
    with user_errors():
        try:
            out = run_bench_links(tuple(dict.fromkeys(scenarios)), islands, tokens, runs,
                                  Path(workdir) if workdir else None, iptables=binary,
                                  log=lambda msg: click.echo(msg, err=True))
        except RuntimeError as e:  # the bootstrap node did not start: its log is named
            raise click.ClickException(str(e)) from e
    echo_result(out, as_json, table)


@bench.command("gpu")
@click.option("--device", default="cuda", show_default=True, callback=device_spec, metavar="DEVICE",
              help="Where both islands train (cpu: the CI run of this check).")
@click.option("--preset", type=click.Choice(sorted(MODEL_PRESETS)), default="gpt2-small", show_default=True,
              help="The islands' model.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--vocab-size", type=click.IntRange(256, 65536), default=GPT2_VOCAB, show_default=True,
              help="Vocabulary of the token shards written for the run (the embedded corpus's bytes as ids).")
@click.option("--rounds", type=click.IntRange(1, 1000), default=20, show_default=True, help="Rounds each island trains.")
@click.option("--local-steps", "-H", type=click.IntRange(1, 10_000), default=DiLoCoConfig.local_steps,
              show_default=True, help="Inner steps per round.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=TrainConfig.batch_size, show_default=True,
              help="Sequences per inner step (the plain loop's too).")
@click.option("--plain-steps", type=click.IntRange(1, 10_000), default=30, show_default=True,
              help="Timed steps of the plain training loop, the baseline (after 10 untimed ones).")
@click.option("--big-preset", type=click.Choice(["none", *sorted(MODEL_PRESETS)]), default="gpt2-1b", show_default=True,
              help="The model of the second pair of islands (none: no second pair).")
@click.option("--big-rounds", type=click.IntRange(0, 1000), default=3, show_default=True,
              help="Rounds each of the second pair trains (0: no second pair).")
@click.option("--big-batch-size", type=click.IntRange(1, 4096), default=4, show_default=True,
              help="Sequences per inner step of the second pair (two ~1B islands fit one 80 GB GPU at 4).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the shards, logs and checkpoints here.")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Also write the JSON object to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout; progress goes to stderr.")
def bench_gpu(device, preset, precision, vocab_size, rounds, local_steps, batch_size, plain_steps, big_preset,
              big_rounds, big_batch_size, workdir, output, as_json) -> None:
    """On one GPU: a plain training loop, two islands (gpt2-small, bf16) for 20 rounds, two ~1B islands
    for a few, then `bench round`: tokens/s against the plain loop, utilization, MFU, losses, mixes,
    round overhead, peak memory."""
    from p2p_diloco.bench.gpu import run_bench_gpu

    with user_errors():
        try:
            out = run_bench_gpu(device, preset, precision, vocab_size, rounds, local_steps, batch_size,
                                None if big_preset == "none" else big_preset, big_rounds, big_batch_size, plain_steps,
                                Path(workdir) if workdir else None, log=lambda msg: click.echo(msg, err=True))
        except RuntimeError as e:  # an island or the round's process failed: its log is named
            raise click.ClickException(str(e)) from e
    text = json.dumps(out)
    if output:
        Path(output).write_text(text + "\n")
    if as_json:
        click.echo(text)
        return
    p = out["plain"]
    click.echo(f"plain loop: {p['tokens_per_s']:,.0f} tokens/s, MFU {_pct(p['mfu'])}")
    for pair in [out] + ([out["big"]] if out["big"] else []):
        for i in pair["islands"]:
            click.echo(f"{pair.get('preset')} {i['name']}: {i['tokens_per_s'] or 0:,.0f} tokens/s, steady utilization "
                       f"{i['steady_utilization'] or 0:.3f} (start-up {i['startup_s']:.0f} s), MFU {_pct(i['mfu'])}, "
                       f"loss {i['loss_start']:.3f} -> {i['loss_end']:.3f}, {i['mixes']} mixes")
    click.echo(f"islands together: {out['islands_vs_plain']:.3f}x the plain loop's tokens/s")
    r, m = out["round"], out["memory"]
    click.echo(f"round: {r['overhead_s']:.3f} s, {r['overhead_vs_clone']:.1f} clones of the state; peak memory "
               f"{m['peak_bytes'] / 2**30:.2f} GiB, x{m['peak_vs_model_optimizer']:.2f} model + optimizer ({m['method']})")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


RETIRED_FOR_MEMBER = ("--slowdown", "--poison", "--latency-ms", "--bandwidth-mbps")
"""Options `join` retired to `bench member`, which takes them itself."""


@bench.command("member", hidden=True, params=[
    *(p for p in join.params if p.opts[0] not in RETIRED_FOR_MEMBER),  # join's, less the retired ones it takes
    click.Option(["--slowdown"], type=click.FloatRange(min=1.0), default=1.0, show_default=True,
                 help="Run this many times slower than the machine allows (idle after each inner step)."),
    click.Option(["--poison"], type=click.Choice(POISONS), default=None,
                 help="Publish poisoned states instead of the island's own: a hostile member."),
    click.Option(["--latency-ms"], type=float, default=0.0, show_default=True,
                 help="Emulated one-way latency of every message this island sends."),
    click.Option(["--bandwidth-mbps"], type=float, default=None, help="Emulated rate of this island's uplink, Mbit/s.")])
def bench_member(slowdown, poison, latency_ms, bandwidth_mbps, **kw) -> None:
    """`join` with faults injected and its link emulated (a test double for benchmarks and tests,
    `bench/member.py`)."""
    from p2p_diloco.bench.member import faults
    from p2p_diloco.exchange.linkemu import EmulatedLink

    with user_errors():
        link = EmulatedLink(latency_ms, bandwidth_mbps)
    run_join(kw, **faults(slowdown, poison, link))
