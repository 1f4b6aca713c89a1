"""The real dashboard app, driven by the pilot, watching a live swarm on 127.0.0.1."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest
from conftest import EXPIRY, REFRESH, run_app, until
from p2p_diloco.tui import make_app
from p2p_diloco.tui.screens import DetailScreen
from p2p_diloco.tui.widgets import EventLog, PeersTable, SwarmHeader
from rich.console import Console


WATCH_IN_FRESH_INTERPRETER = """
import json, sys, threading
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.tui import MembershipSource
config = DiscoveryConfig(**json.loads(sys.argv[1]))
want, seen, done = set(json.loads(sys.argv[2])), [], threading.Event()
def deliver(snap):
    if snap.records and want <= set(snap.records):
        seen.append(snap.kind)
        done.set()
source = MembershipSource(config, retry=0.5)
source.start(deliver)
done.wait(90)
source.stop()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "hivemind") or m.startswith("p2p_diloco.core"))
print(json.dumps({"kind": seen[0] if seen else None, "heavy": heavy}))
"""
"""A dashboard source in a fresh interpreter; argv: DiscoveryConfig fields, the peer ids to wait for."""


def cell(table: PeersTable, peer_id: str, column: str) -> str:
    return table.get_cell(peer_id, column).plain


def row_ids(table: PeersTable) -> list[str]:
    return [row.key.value for row in table.ordered_rows]


def plain(renderable) -> str:
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def header_text(app) -> str:
    return str(app.query_one(SwarmHeader).content)


@pytest.mark.timeout(150)
def test_table_follows_two_islands_sorts_details_and_marks_a_killed_one_gone(zmq_swarm):
    swarm = zmq_swarm
    swarm.start_bootstrap()
    a, b = swarm.add_islands(2)
    ids = {a.peer_id, b.peer_id}
    app = make_app(swarm.source())
    measured = {}

    async def scenario(pilot):
        table = app.query_one(PeersTable)
        await until(pilot, lambda: set(row_ids(table)) == ids, 20, "both islands in the table")
        assert "connected via zmq" in header_text(app) and "2 live" in header_text(app)
        for pid in ids:
            assert cell(table, pid, "address").startswith("127.0.0.1:21") and cell(table, pid, "state") == "training"
        first = {pid: int(cell(table, pid, "version")) for pid in ids}
        await until(pilot, lambda: all(int(cell(table, pid, "version")) > first[pid] for pid in ids), 15,
                    "both versions to grow")

        # sorting: three presses of s walk id -> address -> state -> version; S reverses
        await pilot.press("s", "s", "s")
        assert (table.sort_column, table.reverse) == ("version", False)
        versions = [int(cell(table, pid, "version")) for pid in row_ids(table)]
        assert versions == sorted(versions)
        await pilot.press("S")
        await pilot.pause(0.2)
        versions = [int(cell(table, pid, "version")) for pid in row_ids(table)]
        assert table.reverse and versions == sorted(versions, reverse=True)
        assert "sorted by version ▼" in str(table.border_title)

        # Enter opens the highlighted island's detail view, which grows its history live
        chosen = row_ids(table)[table.cursor_row]
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), 5, "the detail view")
        assert app.screen.peer_id == chosen
        head = lambda: str(app.screen.query_one("#detail-head").content)  # noqa: E731
        assert chosen in head()
        samples = len(app.state.islands[chosen].history)
        await until(pilot, lambda: len(app.state.islands[chosen].history) > samples + 2, 10, "more history")
        fields = plain(app.screen.query_one("#fields").content)
        assert f"samples       {len(app.state.islands[chosen].history)}" in fields
        assert f"version       v{app.state.islands[chosen].record.version}" in fields
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DetailScreen), 5, "back to the main view")

        # SIGKILL one island: its row turns "expired" within the record lifetime (plus one poll)
        victim, survivor = (a, b) if a.peer_id == chosen else (b, a)
        t_kill = swarm.kill(victim)
        await until(pilot, lambda: cell(table, victim.peer_id, "state") == "expired", EXPIRY + 10, "the victim to expire")
        measured["gone_after"] = gone_after = time.monotonic() - t_kill
        assert gone_after <= EXPIRY + 2 * REFRESH + 1.0, f"marked gone {gone_after:.1f} s after the kill"
        assert cell(table, survivor.peer_id, "state") == "training"
        assert "1 live / 2 seen" in header_text(app)
        assert any(e.kind == "expired" and e.peer_id == victim.peer_id for e in app.state.events)
        assert len(app.query_one(EventLog).lines) == len(app.state.events)

        # the bootstrap goes away: the survivor is still watched through peer exchange
        swarm.bootstrap.stop()
        v0 = int(cell(table, survivor.peer_id, "version"))
        await pilot.pause(EXPIRY + 1)
        await until(pilot, lambda: int(cell(table, survivor.peer_id, "version")) > v0, 10, "the survivor to go on")
        assert cell(table, survivor.peer_id, "state") == "training"

    run_app(scenario, app)
    print(f"killed island shown gone after {measured['gone_after']:.1f} s (expiry {EXPIRY} s)")


@pytest.mark.timeout(120)
def test_dashboard_started_before_the_bootstrap_shows_disconnected_then_the_swarm(zmq_swarm):
    swarm = zmq_swarm
    app = make_app(swarm.source([swarm.rendezvous_address()], connect_timeout=0.5))

    async def scenario(pilot):
        await until(pilot, lambda: app.state.status == "disconnected", 15, "the dashboard to report disconnected")
        assert "disconnected: retrying every 0.5s; no rendezvous answered within 0.5 s" in header_text(app)
        swarm.start_bootstrap()
        (island,) = swarm.add_islands(1)
        table = app.query_one(PeersTable)
        await until(pilot, lambda: row_ids(table) == [island.peer_id], 30, "the island after the bootstrap came up")
        assert "connected via zmq" in header_text(app)
        kinds = [e.kind for e in app.state.events]
        assert kinds.index("disconnected") < kinds.index("connected") < kinds.index("join")

    run_app(scenario, app)


@pytest.mark.timeout(240)
def test_dashboard_over_the_dht(dht_swarm):
    swarm = dht_swarm
    swarm.start_bootstrap()
    islands = swarm.add_islands(2)
    ids = {i.peer_id for i in islands}
    app = make_app(swarm.source(connect_timeout=30.0))

    async def scenario(pilot):
        table = app.query_one(PeersTable)
        await until(pilot, lambda: set(row_ids(table)) == ids, 60, "both DHT islands in the table")
        assert "connected via dht" in header_text(app)
        first = {pid: int(cell(table, pid, "version")) for pid in ids}
        await until(pilot, lambda: all(int(cell(table, pid, "version")) > first[pid] for pid in ids), 20,
                    "both versions to grow")

    run_app(scenario, app)
    # the dashboard's source watching the same run from a fresh interpreter: the DHT back-end runs in
    # the observer's child process, so the dashboard's own interpreter loads neither torch nor the core
    fields = {**swarm.config(connect_timeout=30.0).__dict__}
    fields["bootstrap"] = list(fields["bootstrap"])
    out = subprocess.run([sys.executable, "-c", WATCH_IN_FRESH_INTERPRETER, json.dumps(fields), json.dumps(sorted(ids))],
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["kind"] == "dht", f"the islands were never seen over the DHT: {out.stderr[-2000:]}"
    assert result["heavy"] == []
