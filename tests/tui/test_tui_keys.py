"""Keys of the dashboard driven by the pilot over a replayed history: pause, help, header clicks, quit."""

from __future__ import annotations

from conftest import run_app, until
from p2p_diloco.tui import ReplaySource, make_app
from p2p_diloco.tui.messages import SwarmUpdated
from p2p_diloco.tui.screens import HelpScreen
from p2p_diloco.tui.widgets import PeersTable, SwarmHeader
from timeline import EXPIRY, IDS, timeline


def version_shown(app, name: str) -> int:
    return int(app.query_one(PeersTable).get_cell(IDS[name], "version").plain)


def test_pause_freezes_the_view_but_not_the_data():
    source = ReplaySource.from_timeline(timeline(), expiry=EXPIRY)
    first, rest = source.frames[:5], source.frames[5:]
    source.frames = first
    app = make_app(source)

    async def scenario(pilot):
        await until(pilot, lambda: app.state.snapshots == 5, 10, "the first snapshots")
        await pilot.press("p")
        assert app.paused and "paused" in str(app.query_one(SwarmHeader).content)
        assert version_shown(app, "a") == 24
        for frame in rest:  # what the source thread would deliver meanwhile
            app.post_message(SwarmUpdated(frame))
        await until(pilot, lambda: app.state.snapshots == len(timeline()), 20, "every snapshot")
        assert app.state.islands[IDS["a"]].record.version == 79 and version_shown(app, "a") == 24
        assert IDS["e"] not in [row.key.value for row in app.query_one(PeersTable).ordered_rows]
        await pilot.press("p")
        assert not app.paused and version_shown(app, "a") == 79
        assert "paused" not in str(app.query_one(SwarmHeader).content)
        assert IDS["e"] in [row.key.value for row in app.query_one(PeersTable).ordered_rows]

    run_app(scenario, app)


def test_help_opens_and_closes_and_a_header_click_sorts():
    app = make_app(ReplaySource.from_timeline(timeline(), expiry=EXPIRY))

    async def scenario(pilot):
        await until(pilot, lambda: app.state.snapshots == len(timeline()), 10, "every snapshot")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        table = app.query_one(PeersTable)
        columns = [c.key.value for c in table.ordered_columns]
        x = sum(c.get_render_width(table) for c in table.ordered_columns[:columns.index("version")]) + 2
        await pilot.click(PeersTable, offset=(x, 1))  # the "version" header
        await pilot.pause()
        assert (table.sort_column, table.reverse) == ("version", False)
        order = [row.key.value for row in table.ordered_rows]
        assert order == [IDS[n] for n in "dae"] + [IDS[n] for n in "bc"]  # live by version (a before e: tie on id)
        await pilot.click(PeersTable, offset=(x, 1))
        await pilot.pause()
        assert table.reverse
        await pilot.press("q")

    run_app(scenario, app)
    assert app.return_code == 0
