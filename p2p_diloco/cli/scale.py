"""`p2p-diloco bench discovery` and `bench churn`: the swarm at size (`bench.discovery`, `bench.churn`)."""

from __future__ import annotations

from pathlib import Path

import click

from p2p_diloco.bench.discovery import KINDS
from p2p_diloco.choices import DISCOVERY_KINDS
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig
from p2p_diloco.cli.options import echo_result


@click.command("discovery")
@click.option("--members", type=click.IntRange(2, 256), default=32, show_default=True,
              help="Member processes joining one bootstrap node at once (each announces and watches; none trains).")
@click.option("--kind", type=click.Choice(KINDS), default="dht", show_default=True,
              help="dht: the hivemind DHT (the default discovery); zmq: the ZeroMQ rendezvous and peer exchange.")
@click.option("--deadline", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds from the spawn after which the members that have not seen all count as not done.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the logs here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_discovery(members, kind, deadline, workdir, as_json) -> None:
    """Discovery at size: each member's time until it saw every other, its start and its memory; the
    bootstrap node's peers and CPU."""
    from p2p_diloco.bench.discovery import run_bench_discovery, table

    try:
        out = run_bench_discovery(members, kind, deadline, Path(workdir) if workdir else None,
                                  log=lambda msg: click.echo(msg, err=True))
    except RuntimeError as e:  # the bootstrap node did not start: its log is named
        raise click.ClickException(str(e)) from e
    echo_result(out, as_json, table)


@click.command("churn")
@click.option("--islands", type=click.IntRange(4, 64), default=16, show_default=True,
              help="Island processes in each swarm (the tiny preset, one torch thread each).")
@click.option("--tokens", type=click.IntRange(min=1), default=None,
              help="Tokens every island trains.  [default: 8 rounds]")
@click.option("--kills", type=click.IntRange(min=0), default=None,
              help="Islands killed with SIGKILL once and started again with --resume.  [default: a quarter]")
@click.option("--late", type=click.IntRange(min=0), default=2, show_default=True,
              help="Islands that join from nothing a third of the way in.")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Swarms with churn, and as many without: judged on their mean.")
@click.option("--seed", type=int, default=0, show_default=True, help="Who is killed when (run k draws with seed + k).")
@click.option("-H", "--local-steps", type=click.IntRange(min=1), default=DiLoCoConfig.local_steps, show_default=True,
              help="Inner steps per round.")
@click.option("--discovery", type=click.Choice(DISCOVERY_KINDS), default=DiscoveryConfig.discovery, show_default=True,
              help="How the islands find each other (join --discovery): 16 DHT nodes and their daemons on one 2-core "
                   "machine take most of its CPU, so the ZeroMQ fallback measures the training there.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the runs here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_churn(islands, tokens, kills, late, runs, seed, local_steps, discovery, workdir, as_json) -> None:
    """A swarm through churn: islands killed and resumed, late joiners, against the same swarm without:
    eval loss, mixes per round, the load each island serves, partial mixes, processes left behind."""
    from p2p_diloco.bench.churn import run_bench_churn, table

    try:
        out = run_bench_churn(islands, tokens, kills, late, runs, seed, local_steps, discovery,
                              workdir=Path(workdir) if workdir else None,
                              log=lambda msg: click.echo(msg, err=True))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--kills/--late") from e
    except RuntimeError as e:  # a swarm that did not start or finish: its folder is named
        raise click.ClickException(str(e)) from e
    echo_result(out, as_json, table)
