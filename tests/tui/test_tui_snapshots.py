"""Snapshot tests of the dashboard at 120x36, rendered from a fixed history of five islands.

The app is fed by a `ReplaySource` playing `timeline.timeline()`: real `IslandRecord`s at fixed
times. Every time the dashboard shows comes from those snapshots (its clock is the snapshot
time), and the time zone is pinned to UTC, so the pictures do not depend on when or where they
run. Regenerate with `pytest tests/tui --snapshot-update` and look at the SVGs before committing.
"""

from __future__ import annotations

import time

import pytest
from p2p_diloco.tui import ReplaySource, make_app
from p2p_diloco.tui.screens import DetailScreen
from p2p_diloco.tui.widgets import PeersTable
from timeline import EXPIRY, IDS, timeline

SIZE = (120, 36)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def replay_app():
    return make_app(ReplaySource.from_timeline(timeline(), expiry=EXPIRY))


async def settled(pilot) -> None:
    """Wait until every replayed snapshot has been ingested and rendered."""
    for _ in range(50):
        if pilot.app.state.snapshots == len(timeline()):
            break
        await pilot.pause(0.02)
    assert pilot.app.state.snapshots == len(timeline())
    await pilot.pause()


def test_main_screen(snap_compare, utc):
    """Three live islands (d far behind, in red), b expired after a kill, c left cleanly, e joined late."""
    assert snap_compare(replay_app(), terminal_size=SIZE, run_before=settled)


def test_detail_view(snap_compare, utc):
    """Island a's record, loss / throughput / link-rate history and its events."""

    async def open_detail(pilot):
        await settled(pilot)
        assert pilot.app.query_one(PeersTable).cursor_row == 0  # a sorts first by id
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(pilot.app.screen, DetailScreen) and pilot.app.screen.peer_id == IDS["a"]

    assert snap_compare(replay_app(), terminal_size=SIZE, run_before=open_detail)


def test_sorted_by_loss(snap_compare, utc):
    """The table sorted by loss, worst first (eight presses of s walk to the loss column, S reverses)."""

    async def sort_by_loss(pilot):
        await settled(pilot)
        await pilot.press(*"ssssssss", "S")
        table = pilot.app.query_one(PeersTable)
        assert (table.sort_column, table.reverse) == ("loss", True)
        await pilot.pause()

    assert snap_compare(replay_app(), terminal_size=SIZE, run_before=sort_by_loss)
