"""`p2p-diloco status` and `p2p-diloco dashboard`: read a run's member list, once or live.

A run with a swarm secret seals its records: both commands take the secret like `join` does
(`--secret`, `--secret-file`, `P2P_DILOCO_SECRET`) and, without it, show no islands and say why.
"""

from __future__ import annotations

import json
import sys
import time

import click

from p2p_diloco.cli.options import discovery_config, discovery_options, resolve_secret, secret_options
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery.membership import sealed_hint
from p2p_diloco.discovery.records import IslandRecord, label_among
from p2p_diloco.errors import P2PDiLoCoError


DASHBOARD_CONNECT_S = 5.0
"""How long the dashboard waits for a bootstrap node before it shows `disconnected` and retries."""
WATCH_SECRET_HELP = "Swarm secret of the run: needed to read its records when they are sealed."


@click.command()
@discovery_options(required=True)
@click.option("--json", "as_json", is_flag=True,
              help="Print {run_id, islands, discovery} as JSON: each island's record and its `label` (name or peer id prefix).")
@click.option("--timeout", type=float, default=DiscoveryConfig.connect_timeout, show_default=True,
              help="Seconds to wait for a bootstrap node.")
@secret_options(WATCH_SECRET_HELP)
def status(bootstrap, run_id, discovery, as_json, timeout, secret, secret_file):
    """Show the live islands of a run."""
    from p2p_diloco.discovery import open_membership

    config = discovery_config(bootstrap, run_id, discovery, connect_timeout=timeout,
                              secret=resolve_secret(secret, secret_file))
    try:
        with open_membership(config, observer=True) as membership:
            records, kind = membership.refresh(timeout), membership.kind
            hint = sealed_hint(membership, records)
    except P2PDiLoCoError as e:
        raise click.ClickException(str(e)) from e
    if hint:
        click.echo(hint, err=True)
    if as_json:
        islands = [{**r.to_dict(), "label": r.label} for r in sorted(records.values(), key=lambda r: r.peer_id)]
        click.echo(json.dumps({"run_id": run_id, "islands": islands, "discovery": kind}))
    else:
        click.echo(f"run {run_id!r}: {len(records)} live island(s) via {kind}")
        if records:
            click.echo(format_islands(records, time.time()))


@click.command()
@discovery_options(required=True)
@click.option("--refresh", type=click.FloatRange(0.05, 60), default=DiscoveryConfig.poll, show_default=True,
              help="Seconds between reads of the member list.")
@click.option("--expiry", type=click.FloatRange(1, 3600), default=DiscoveryConfig.expiry, show_default=True,
              help="Record lifetime the islands use (a record gone after this long silent counts as expired).")
@secret_options(WATCH_SECRET_HELP)
def dashboard(bootstrap, run_id, discovery, refresh, expiry, secret, secret_file):
    """Watch a run live: islands, staleness, throughput, loss, links and events (q quits, ? helps)."""
    from p2p_diloco.tui import MembershipSource, run_dashboard, should_use_dashboard

    if not should_use_dashboard(environ={}):
        raise click.ClickException("the dashboard needs a terminal; `p2p-diloco status` prints the islands once")
    config = discovery_config(bootstrap, run_id, discovery, poll=min(refresh, expiry), expiry=expiry,
                              refresh=min(DiscoveryConfig.refresh, expiry / 2), connect_timeout=DASHBOARD_CONNECT_S,
                              secret=resolve_secret(secret, secret_file))
    sys.exit(run_dashboard(MembershipSource(config)))


def format_islands(records: dict[str, IslandRecord] | list[IslandRecord], now: float) -> str:
    """A plain-text table of island records (what `p2p-diloco status` prints); `island` is its name, or
    its peer id's prefix (`island_label`); `reach` says whether others can dial an island (`direct`) or
    it only dials out (`outbound`); `util` the share of its time in inner steps (where the rest went
    under the table: `peers.rounds.timebook`); `fetches` what an island with `--exchange auto` fetches now
    (`state` or `updates`; `-` for a fixed exchange), why under the table; `partner` the island it
    last mixed with."""
    rows = sorted(records.values() if isinstance(records, dict) else records, key=lambda r: (r.label, r.peer_id))
    known = {r.peer_id: r for r in rows}
    head = ("island", "peer id", "state", "version", "tokens", "tok/s", "util", "loss", "age s", "reach", "fetches",
            "partner", "endpoint")
    body = [(r.label, r.peer_id, r.state, str(r.version), str(r.tokens), f"{r.tokens_per_s:.0f}",
             f"{r.utilization:.3f}" if r.utilization else "-",
             "-" if r.loss is None else f"{r.loss:.4f}", f"{max(0.0, now - r.timestamp):.1f}" if r.timestamp else "-",
             r.reach, r.fetching or "-", label_among(known, r.last_partner), r.endpoint) for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
    lines += [f"{r.label} trains alone: {r.alone}" for r in rows if r.alone]
    lines += [f"{r.label} fetches {r.fetches}" for r in rows if r.fetching == "updates"]
    lines += [f"{r.label} spent its time: {r.time_split}" for r in rows if r.time_split]
    return "\n".join(lines)
