"""`p2p-diloco demo`: a local swarm of real processes on 127.0.0.1, then a summary."""

from __future__ import annotations

import json
from pathlib import Path

import click

from p2p_diloco.cli.options import data_options, device_options, offload_option, user_errors
from p2p_diloco.config import TrainConfig
from p2p_diloco.peers.launch.demo import DemoConfig


@click.command()
@click.option("--islands", "-k", type=click.IntRange(2, 16), default=DemoConfig.islands, show_default=True,
              help="Number of islands.")
@click.option("--minutes", type=float, default=DemoConfig.minutes, show_default=True, help="Training time of each island.")
@click.option("--latency-ms", type=float, default=DemoConfig.latency_ms, show_default=True, help="Emulated one-way link latency.")
@click.option("--bandwidth-mbps", type=float, default=DemoConfig.bandwidth_mbps, help="Emulated link bandwidth, Mbit/s.")
@click.option("--compare", is_flag=True, help="Also train the data-parallel baseline at the same tokens.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep logs, metrics and checkpoints here.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@data_options
@device_options
@offload_option
def demo(islands, minutes, latency_ms, bandwidth_mbps, compare, workdir, as_json, data, vocab_size, device, precision,
         offload_outer) -> None:
    """Run a local swarm: a bootstrap node and islands as processes on 127.0.0.1, then a summary."""
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.core.device import autocast, resolve_device
    from p2p_diloco.peers.launch.demo import run_demo
    from p2p_diloco.tui.launch import should_use_dashboard

    with user_errors():
        train = TrainConfig(device=device, precision=precision)
        autocast(resolve_device(train.device), train.precision)  # fails here, in one line, before any process starts
        load_corpus(data, vocab_size)  # so does data that cannot be read
    # each island resolves the same spec itself (`auto` on its own machine, as `join` would)
    device_args = ("--device", device, "--precision", precision)
    cfg = DemoConfig(islands=islands, minutes=minutes, latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps,
                     compare=compare, offload_outer=offload_outer, workdir=Path(workdir) if workdir else None,
                     dashboard=not as_json and should_use_dashboard(), extra_args=device_args, data=data,
                     vocab_size=vocab_size)
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

    console = Console()
    console.print(islands_table(summary["islands"], f"{islands} islands, {minutes:g} minutes each"))
    for r in summary["islands"]:
        if r["alone"]:
            console.print(f"{r['id']} trained alone at the end: {r['alone']}", style="bold yellow", markup=False)
        elif r["alone_episodes"]:
            console.print(f"{r['id']} trained alone {r['alone_episodes']} time(s) for a while (its log says why)",
                          style="yellow", markup=False)
    if summary["baseline_eval_loss"] is not None:
        console.print(f"data-parallel baseline at the same tokens: eval loss {summary['baseline_eval_loss']:.3f}")
    console.print(f"bytes moved between islands: {summary['bytes_moved'] / 1e6:.1f} MB   (logs: {summary['workdir']})")
    console.print("sample:", style="bold")
    console.print(summary["sample"], markup=False, highlight=False)


def islands_table(rows: list[dict], title: str):
    """The demo's table of its islands (`run_demo`'s `islands`), by name: with no borders, its 9
    columns fit the 80 columns a pipe gets without cutting a name or a number."""
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False)
    table.add_column("island", no_wrap=True)  # the names the dashboard and the progress lines show
    for col in ("start\nloss", "eval\nloss", "tokens", "version", "mixes", "refused", "failed\nfetches", "util"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(r["id"], f"{r['initial_loss']:.3f}", f"{r['eval_loss']:.3f}", f"{r['tokens']:,}", str(r["version"]),
                      str(r["mixes"]), str(r["refused"]), str(r["failed_fetches"]), f"{r['utilization']:.3f}")
    return table
