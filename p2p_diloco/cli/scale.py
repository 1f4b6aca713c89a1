"""`p2p-diloco bench discovery`: the swarm at size (`bench.discovery`)."""

from __future__ import annotations

from pathlib import Path

import click

from p2p_diloco.bench.discovery import KINDS
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
