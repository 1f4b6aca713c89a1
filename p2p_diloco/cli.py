"""The `p2p-diloco` command line: one click group, one small function per subcommand.

This is the only composition root: each command parses options, builds a config and calls the
library. Heavy imports (torch, hivemind, zmq, textual) happen inside command bodies so that
`p2p-diloco --help` is instant. Expected failures become `click.ClickException` (no traceback).
"""

from __future__ import annotations

import logging
import os
import sys

import click

from p2p_diloco import __version__
from p2p_diloco.cli_options import DISCOVERY_CHOICES, discovery_config, discovery_options
from p2p_diloco.config import DiLoCoConfig


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    """`--config FILE`: a TOML file whose `[command]` tables give defaults for that command's options.

    Precedence stays flag > environment variable (P2P_DILOCO_<COMMAND>_<OPTION>) > file > default.
    """
    if path is None:
        return
    from p2p_diloco.config import load_toml
    from p2p_diloco.errors import ConfigError

    try:
        ctx.default_map = _default_map(ctx.command, load_toml(path))
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


def _default_map(group: click.Group, tables: dict, where: str = "") -> dict:
    """The file's tables as click's default_map, checked against the commands: a misspelt table or
    option is an error naming what exists, not a setting silently ignored."""
    from p2p_diloco.errors import ConfigError

    out = {}
    for name, table in tables.items():
        cmd, section = group.commands.get(name), f"{where}{name}"
        if cmd is None:
            raise ConfigError(f"[{section}]: no such command; known: {', '.join(sorted(group.commands))}")
        if not isinstance(table, dict):
            raise ConfigError(f"{section} must be a table ([{section}]) of option defaults, got {table!r}")
        if isinstance(cmd, click.Group):
            out[name] = _default_map(cmd, table, f"{section}.")
            continue
        # an option is named as on the command line (`local-steps`, `json`) or as its parameter
        names = {p.name: p.name for p in cmd.params if p.name}
        names |= {o[2:].replace("-", "_"): p.name for p in cmd.params for o in p.opts if o.startswith("--")}
        unknown = sorted(k for k in table if k.replace("-", "_") not in names)
        if unknown:
            known = sorted(o[2:] for p in cmd.params for o in p.opts if o.startswith("--"))
            raise ConfigError(f"[{section}]: unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}")
        out[name] = {names[k.replace("-", "_")]: v for k, v in table.items()}
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "P2P_DILOCO"})
@click.version_option(__version__, prog_name="p2p-diloco")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--config", type=click.Path(dir_okay=False), callback=_load_config_file, expose_value=False,
              is_eager=True, help="TOML file with a [command] table of option defaults per command.")
def main(verbose: int) -> None:
    """Peer-to-peer DiLoCo: train one model across machines on ordinary internet links."""
    _setup_logging(verbose)


def _csv(kind):
    """click callback: parse a comma-separated list into a tuple of `kind`."""

    def parse(_ctx, param, value):
        if value is None or isinstance(value, tuple):
            return value
        try:
            return tuple(kind(v.strip()) for v in str(value).split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(f"expected a comma-separated list: {e}", param=param) from e

    return parse


def model_options(f):
    """Options shared by every command that builds a model and reads data."""
    f = click.option("--model", "model_size", default="tiny", show_default=True, help="Model preset: tiny or small.")(f)
    f = click.option("--n-layer", type=int, default=None, help="Override the preset's number of blocks.")(f)
    f = click.option("--n-embd", type=int, default=None, help="Override the preset's width.")(f)
    f = click.option("--n-head", type=int, default=None, help="Override the preset's attention heads.")(f)
    f = click.option("--block-size", type=int, default=None, help="Override the preset's context length.")(f)
    f = click.option("--data", type=click.Path(), default=None,
                     help="Text file or folder of text files (default: this Python's standard-library sources).")(f)
    f = click.option("--batch-size", type=int, default=16, show_default=True, help="Sequences per inner step.")(f)
    f = click.option("--lr", type=float, default=3e-3, show_default=True, help="Peak inner AdamW learning rate.")(f)
    return f


def diloco_options(f):
    """Options of the outer loop, shared by `simulate` and `join`."""
    D = DiLoCoConfig
    f = click.option("--local-steps", "-H", type=int, default=D.local_steps, show_default=True, help="H: inner steps per round.")(f)
    f = click.option("--outer-lr", type=float, default=D.outer_lr, show_default=True, help="Outer Nesterov learning rate.")(f)
    f = click.option("--outer-momentum", type=float, default=D.outer_momentum, show_default=True, help="Outer Nesterov momentum.")(f)
    f = click.option("--momentum", type=click.Choice(["mixed", "local"]), default=D.momentum, show_default=True,
                     help="Mix outer momentum with the partner's, or keep it local.")(f)
    f = click.option("--mix-at", type=click.Choice(["arrival", "round-end"]), default=D.mix_at, show_default=True,
                     help="Mix a partner's state as soon as it arrives (anchor and weights), or at the end of the round.")(f)
    f = click.option("--mix-weight", type=float, default=D.mix_weight, show_default=True,
                     help="Partner weight at equal tokens and no staleness.")(f)
    f = click.option("--mix-pseudo-gradient/--no-mix-pseudo-gradient", default=D.mix_pseudo_gradient, show_default=True,
                     help="Average the pseudo-gradient with the partner's as well.")(f)
    f = click.option("--max-staleness", type=int, default=D.max_staleness, show_default=True,
                     help="Skip partners more than this many versions behind.")(f)
    return f


def build_configs(kw: dict):
    """Turn parsed model/train/outer options into validated config dataclasses (pops what it uses)."""
    from p2p_diloco.config import ModelConfig, TrainConfig

    model = ModelConfig(size=kw.pop("model_size"), n_layer=kw.pop("n_layer"), n_embd=kw.pop("n_embd"),
                        n_head=kw.pop("n_head"), block_size=kw.pop("block_size"))
    train = TrainConfig(batch_size=kw.pop("batch_size"), lr=kw.pop("lr"), seed=kw.get("seed", 0))
    diloco = DiLoCoConfig(local_steps=kw.pop("local_steps"), outer_lr=kw.pop("outer_lr"),
                          outer_momentum=kw.pop("outer_momentum"), momentum=kw.pop("momentum"),
                          mix_at=kw.pop("mix_at"), mix_weight=kw.pop("mix_weight"), mix_pseudo_gradient=kw.pop("mix_pseudo_gradient"),
                          max_staleness=kw.pop("max_staleness"))
    return model, train, diloco


def user_errors():
    """Context manager: the project's own errors become readable click errors (no traceback)."""
    import contextlib

    from p2p_diloco.errors import P2PDiLoCoError

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except P2PDiLoCoError as e:
            raise click.ClickException(str(e)) from e

    return guard()


@main.command()
@model_options
@diloco_options
@click.option("--islands", "-k", type=int, default=4, show_default=True, help="K: number of islands.")
@click.option("--method", "methods", default="gossip,allreduce,dp", show_default=True, callback=_csv(str),
              help="Comma list of gossip, allreduce (synchronous DiLoCo), dp (data parallel).")
@click.option("--tokens", type=int, default=1_500_000, show_default=True, help="Total training tokens per method.")
@click.option("--time-budget", type=float, default=None, help="Virtual seconds; stop every method when spent.")
@click.option("--speeds", default=None, callback=_csv(float), help="Per-island relative speed, e.g. 1,1,1,0.1.")
@click.option("--drop-prob", type=float, default=0.0, show_default=True, help="Chance an island misses a round.")
@click.option("--latency-ms", type=float, default=100.0, show_default=True, help="Simulated one-way link latency.")
@click.option("--bandwidth-mbps", type=float, default=1000.0, show_default=True, help="Simulated link bandwidth.")
@click.option("--compression", type=click.Choice(["fp32", "bf16", "fp16", "int8"]), default="int8", show_default=True,
              help="Codec applied to every exchanged state.")
@click.option("--mix-delay", type=click.IntRange(0, 1), default=1, show_default=True,
              help="Rounds between a partner's state being published and mixed.")
@click.option("--step-seconds", type=float, default=None,
              help="Virtual seconds of one inner step (default: the tiny model's on the reference machine, "
                   "BENCHMARKS.md); with the link it sets how far into a round a partner's state arrives.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=None,
              help="Methods run at once, each in its own process with one thread (default: the number of cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def simulate(**kw) -> None:
    """Simulate K islands in one process on a virtual clock and compare methods at equal tokens."""
    import torch

    from p2p_diloco.sim_report import run_simulation

    with user_errors():
        as_json, data, jobs = kw.pop("as_json"), kw.pop("data"), kw.pop("jobs") or os.cpu_count() or 1
        if jobs == 1:
            torch.set_num_threads(max(1, torch.get_num_threads()))
        model, train, diloco = build_configs(kw)
        run_simulation(kw, model, train, diloco, data, as_json, jobs)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=0, show_default=True, help="DHT port (0: any free one); the rendezvous takes PORT+1.")
@click.option("--identity", type=click.Path(dir_okay=False), required=True,
              help="Private key file, created on first start; the same file keeps the same peer id.")
@click.option("--addr-file", type=click.Path(dir_okay=False), default=None, help="Also write the addresses here, one per line.")
@click.option("--rendezvous-port", type=int, default=None, help="Port of the ZeroMQ rendezvous (default: DHT port + 1).")
@click.option("--announce-host", default=None, help="Address islands should dial (needed with --host 0.0.0.0).")
@click.option("--discovery", type=click.Choice(DISCOVERY_CHOICES), default="auto", show_default=True,
              help="auto: DHT node and rendezvous (rendezvous only if libp2p fails); dht: DHT only; zmq: rendezvous only.")
def bootstrap(host, port, identity, addr_file, rendezvous_port, announce_host, discovery):
    """Host a bootstrap node and print the addresses islands pass to --bootstrap."""
    import os
    import signal
    import threading

    from bootstrap import BootstrapNode
    from p2p_diloco.errors import P2PDiLoCoError

    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)  # the join/leave log is what a bootstrap node is watched for
    try:
        node = BootstrapNode(host=host, port=port, identity=identity, rendezvous_port=rendezvous_port,
                             discovery=discovery, announce_host=announce_host)
        addrs = node.start()
    except P2PDiLoCoError as e:
        raise click.ClickException(str(e)) from e
    stop, received = threading.Event(), []

    def on_signal(signum, _frame):  # installed after start(): the forked DHT process keeps default handlers
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for addr in addrs:
            click.echo(addr)
        if addr_file:
            tmp = f"{addr_file}.tmp"
            with open(tmp, "w") as f:
                f.write("\n".join(addrs) + "\n")
            os.replace(tmp, addr_file)
        node.run_until(stop)
    finally:
        node.shutdown()
    if received and received[0] == signal.SIGINT:
        sys.exit(130)


@main.command()
@discovery_options(required=True)
@click.option("--json", "as_json", is_flag=True, help="Print {run_id, islands, discovery} as JSON.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for a bootstrap node.")
def status(bootstrap, run_id, discovery, as_json, timeout):
    """Show the live islands of a run."""
    import json
    import time

    from p2p_diloco.errors import P2PDiLoCoError
    from p2p_diloco.membership import format_islands, open_membership

    config = discovery_config(bootstrap, run_id, discovery, connect_timeout=timeout)
    try:
        with open_membership(config, observer=True) as membership:
            records, kind = membership.refresh(timeout), membership.kind
    except P2PDiLoCoError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        islands = [r.to_dict() for r in sorted(records.values(), key=lambda r: r.peer_id)]
        click.echo(json.dumps({"run_id": run_id, "islands": islands, "discovery": kind}))
    else:
        click.echo(f"run {run_id!r}: {len(records)} live island(s) via {kind}")
        if records:
            click.echo(format_islands(records, time.time()))


@main.command()
@discovery_options(required=True)
@click.option("--refresh", type=click.FloatRange(0.05, 60), default=1.0, show_default=True,
              help="Seconds between reads of the member list.")
@click.option("--expiry", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="Record lifetime the islands use (a record gone after this long silent counts as expired).")
def dashboard(bootstrap, run_id, discovery, refresh, expiry):
    """Watch a run live: islands, staleness, throughput, loss, links and events (q quits, ? helps)."""
    from tui import MembershipSource, run_dashboard, should_use_dashboard

    if not should_use_dashboard(environ={}):
        raise click.ClickException("the dashboard needs a terminal; `p2p-diloco status` prints the islands once")
    config = discovery_config(bootstrap, run_id, discovery, poll=min(refresh, expiry), expiry=expiry,
                              refresh=min(5.0, expiry / 2), connect_timeout=5.0)
    sys.exit(run_dashboard(MembershipSource(config)))


@main.group()
def bench() -> None:
    """Measure parts of the system and print the figures quoted in BENCHMARKS.md."""


@bench.command("transport")
@click.option("--params", type=click.IntRange(1, 2_000_000_000), default=50_000_000, show_default=True,
              help="fp32 values in the published state (50M = 200 MB).")
@click.option("--compression", type=click.Choice(["fp32", "bf16", "fp16", "int8"]), default="fp32", show_default=True,
              help="Payload codec.")
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
    import json

    from p2p_diloco.bench_transport import run

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


def network_options(f):
    """Options of the state exchange: codec, upload cap, link emulation, swarm secret."""
    f = click.option("--compression", type=click.Choice(["fp32", "bf16", "fp16", "int8"]), default="int8", show_default=True,
                     help="Codec of the published state (the receiver always accumulates in fp32).")(f)
    f = click.option("--max-upload-mbps", type=float, default=None, help="Cap on what this island's server sends, Mbit/s.")(f)
    f = click.option("--latency-ms", type=float, default=0.0, show_default=True, help="Emulated one-way link latency.")(f)
    f = click.option("--bandwidth-mbps", type=float, default=None, help="Emulated link bandwidth, Mbit/s.")(f)
    f = click.option("--secret", default=None, envvar="P2P_DILOCO_SECRET",
                     help="Swarm secret; islands without it can neither fetch nor inject state.")(f)
    f = click.option("--fetch-timeout", type=float, default=10.0, show_default=True,
                     help="Give up on a partner that sends nothing for this many seconds.")(f)
    return f


@main.command()
@discovery_options()
@model_options
@diloco_options
@network_options
@click.option("--round-seconds", type=float, default=None, help="Time budget of one round's inner steps.")
@click.option("--run-dir", type=click.Path(file_okay=False), default="runs/island", show_default=True,
              help="Folder for metrics.jsonl and checkpoints.")
@click.option("--max-tokens", type=int, default=None, help="Stop after this island trained this many tokens.")
@click.option("--max-rounds", type=int, default=None, help="Stop after this many rounds.")
@click.option("--max-seconds", type=float, default=None, help="Stop after this many seconds of training.")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --run-dir.")
@click.option("--same-version-wait", type=click.FloatRange(0.0, 1.0), default=0.4, show_default=True,
              help="Share of a round spent waiting for a partner (not one of the last two) to publish this "
                   "island's version before taking what it has.")
@click.option("--max-stretch", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="An island ahead of most others trains on past H, by up to this share of H, until its "
                   "rounds end with theirs (0: off).")
@click.option("--wait-for", type=click.IntRange(min=1), default=1, show_default=True,
              help="Before the first round, wait (up to 20 s) until this many islands, this one included, are in the run.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind the snapshot server and DHT node.")
@click.option("--announce", "announce_host", default=None, help="Address others should dial (when --host is not reachable as such).")
@click.option("--port", type=int, default=0, show_default=True, help="Snapshot server port (0: any free port).")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed: the initial weights every island shares.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads for this island.")
@click.option("--eval-every", type=int, default=10, show_default=True, help="Rounds between held-out evaluations.")
@click.option("--checkpoint-every", type=int, default=10, show_default=True, help="Rounds between checkpoints.")
@click.option("--name", default=None, help="Label for the progress line.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the island's summary as JSON at exit.")
@click.option("--slowdown", type=click.FloatRange(min=1.0), default=1.0, hidden=True,
              help="Fault injection: run this many times slower than the machine allows.")
def join(**kw) -> None:
    """Start an island: find the swarm, train rounds, gossip with partners, checkpoint."""
    import dataclasses
    import json
    from pathlib import Path

    import torch

    from p2p_diloco.config import NetworkConfig
    from peers.runner import IslandConfig, run_island

    torch.set_num_threads(kw.pop("threads"))
    with user_errors():
        discovery = discovery_config(kw.pop("bootstrap"), kw.pop("run_id"), kw.pop("discovery"),
                                     host=kw["host"], announce_host=kw["announce_host"])
        data, as_json = kw.pop("data"), kw.pop("as_json")
        model, train, diloco = build_configs(kw)
        diloco = dataclasses.replace(diloco, round_seconds=kw.pop("round_seconds"))
        tokens_per_step = train.batch_size * model.resolved()["block_size"]
        if kw["max_tokens"]:
            train = dataclasses.replace(train, total_steps=max(1, kw["max_tokens"] // tokens_per_step))
        elif kw["max_rounds"]:
            train = dataclasses.replace(train, total_steps=kw["max_rounds"] * diloco.local_steps)
        network = NetworkConfig(compression=kw.pop("compression"), max_upload_mbps=kw.pop("max_upload_mbps"),
                                latency_ms=kw.pop("latency_ms"), bandwidth_mbps=kw.pop("bandwidth_mbps"),
                                secret=kw.pop("secret"), fetch_timeout_s=kw.pop("fetch_timeout"))
        island = IslandConfig(run_dir=Path(kw["run_dir"]), bind_host=kw["host"], announce_host=kw["announce_host"],
                              port=kw["port"], max_tokens=kw["max_tokens"], max_rounds=kw["max_rounds"],
                              max_seconds=kw["max_seconds"], resume=kw["resume"], eval_every=kw["eval_every"],
                              checkpoint_every=kw["checkpoint_every"], name=kw["name"], quiet=kw["quiet"],
                              slowdown=kw["slowdown"], wait_for=kw["wait_for"],
                              same_version_wait=kw["same_version_wait"], max_stretch=kw["max_stretch"])
        code, summary = run_island(island, model, train, diloco, network, discovery, data)
    if as_json and summary:  # ranks other than 0 of a torchrun island have no summary
        click.echo(json.dumps(summary))
    sys.exit(code)


@main.command()
@click.option("--islands", "-k", type=click.IntRange(2, 16), default=4, show_default=True, help="Number of islands.")
@click.option("--minutes", type=float, default=3.0, show_default=True, help="Training time of each island.")
@click.option("--latency-ms", type=float, default=0.0, show_default=True, help="Emulated one-way link latency.")
@click.option("--bandwidth-mbps", type=float, default=None, help="Emulated link bandwidth, Mbit/s.")
@click.option("--compare", is_flag=True, help="Also train the data-parallel baseline at the same tokens.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep logs, metrics and checkpoints here.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def demo(islands, minutes, latency_ms, bandwidth_mbps, compare, workdir, as_json) -> None:
    """Run a local swarm: a bootstrap node and islands as processes on 127.0.0.1, then a summary."""
    import json
    from pathlib import Path

    from peers.demo import DemoConfig, run_demo

    from tui.launch import should_use_dashboard

    cfg = DemoConfig(islands=islands, minutes=minutes, latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps,
                     compare=compare, workdir=Path(workdir) if workdir else None,
                     dashboard=not as_json and should_use_dashboard())
    try:
        summary = run_demo(cfg)
    except KeyboardInterrupt:
        raise SystemExit(130)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(summary))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{islands} islands, {minutes:g} minutes each")
    for col in ("island", "loss at start", "eval loss", "tokens", "version", "utilization"):
        table.add_column(col, justify="right")
    for r in summary["islands"]:
        table.add_row(r["id"], f"{r['initial_loss']:.3f}", f"{r['eval_loss']:.3f}", f"{r['tokens']:,}", str(r["version"]),
                      f"{r['utilization']:.3f}")
    console = Console()
    console.print(table)
    if summary["baseline_eval_loss"] is not None:
        console.print(f"data-parallel baseline at the same tokens: eval loss {summary['baseline_eval_loss']:.3f}")
    console.print(f"bytes moved between islands: {summary['bytes_moved'] / 1e6:.1f} MB   (logs: {summary['workdir']})")
    console.print("sample:", style="bold")
    console.print(summary["sample"], markup=False, highlight=False)


@bench.command("swarm")
@click.option("--islands", "-k", type=click.IntRange(2, 16), default=4, show_default=True)
@click.option("--tokens", type=int, default=1_500_000, show_default=True, help="Total tokens over all islands.")
@click.option("--latency-ms", type=float, default=100.0, show_default=True, help="Emulated one-way latency.")
@click.option("--bandwidth-mbps", type=float, default=1000.0, show_default=True, help="Emulated link bandwidth.")
@click.option("--compression", type=click.Choice(["fp32", "bf16", "fp16", "int8"]), default="int8", show_default=True)
@click.option("--local-steps", "-H", type=int, default=DiLoCoConfig.local_steps, show_default=True, help="H (the join default).")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Run the swarm this many times and report the mean loss (the simulations run once).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the islands' files here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_swarm(islands, tokens, latency_ms, bandwidth_mbps, compression, local_steps, runs, workdir, as_json) -> None:
    """Real islands on loopback over an emulated WAN, against the simulator and data parallel."""
    import json
    from pathlib import Path

    from peers.bench_swarm import run_bench_swarm

    out = run_bench_swarm(islands, tokens, latency_ms, bandwidth_mbps, compression, local_steps,
                          Path(workdir) if workdir else None, runs)
    if as_json:
        click.echo(json.dumps(out))
        return
    for k, v in out.items():
        if k != "per_run":
            click.echo(f"{k:>24}: {v}")
    for k, r in enumerate(out["per_run"]):
        click.echo(f"{'run ' + str(k):>24}: eval loss {r['swarm_eval_loss']:.4f} (x{r['ratio_to_dp']:.4f} dp), islands "
                   f"{', '.join(f'{x:.4f}' for x in r['per_island_eval_loss'])}, utilization "
                   f"{min(r['utilization']):.3f}-{max(r['utilization']):.3f}, {r['bytes_moved']:,} bytes, {r['workdir']}")
