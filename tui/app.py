"""The dashboard app and `make_app(source)`, the factory the CLI, the demo and the tests share.

The app owns a `SwarmState` and a `Source`. The source delivers snapshots from its own thread via
`post_message`; the app ingests each one on its loop and asks every visible widget to render from
the state. Pausing stops the rendering, not the ingesting, so nothing is missed meanwhile.
"""

from __future__ import annotations

import signal
import sys
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.driver import Driver
from textual.widgets import DataTable, Footer

from p2p_diloco.tui.messages import LogLine, StopRequested, SwarmUpdated, TerminalGone
from p2p_diloco.tui.screens import DetailScreen, HelpScreen
from p2p_diloco.tui.source import Snapshot, Source
from p2p_diloco.tui.state import SwarmState
from p2p_diloco.tui.widgets import COLUMNS, EventLog, IslandColors, LossChart, PeersTable, SwarmHeader, ThroughputChart


class DashboardApp(App):
    """Peers table, swarm header, charts and event log of one run (see the module docstring)."""

    TITLE = "p2p-diloco dashboard"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    PeersTable { height: auto; min-height: 6; max-height: 60%; border: round $primary; }
    #charts { height: 1fr; min-height: 8; }
    LossChart, ThroughputChart { width: 1fr; height: 100%; border: round $primary; padding: 0 1; }
    EventLog { height: 8; border: round $primary; padding: 0 1; }
    """
    BINDINGS: ClassVar = [
        Binding("q", "quit", "Quit"),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse", "Reverse", show=False),
        Binding("p", "pause", "Pause"),
        Binding("question_mark", "help", "Help"),
        Binding("ctrl+c", "interrupt", "Quit", show=False, priority=True),
    ]

    def __init__(self, source: Source, state: SwarmState | None = None) -> None:
        super().__init__()
        self.source = source
        self.state = state or SwarmState(expiry=source.expiry)
        self.island_colors = IslandColors()
        self.paused = False
        self.sub_title = f"run {source.run_id}"

    def get_driver_class(self) -> type[Driver]:
        """`tui.driver.TerminalDriver`, which leaves cleanly when the terminal is closed (not on Windows)."""
        if sys.platform == "win32":
            return super().get_driver_class()
        from p2p_diloco.tui.driver import TerminalDriver

        return TerminalDriver

    def compose(self) -> ComposeResult:
        yield SwarmHeader()
        yield PeersTable()
        with Horizontal(id="charts"):
            yield LossChart()
            yield ThroughputChart()
        yield EventLog()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(LossChart).border_title = "loss per island"
        self.query_one(ThroughputChart).border_title = "swarm throughput (tokens/s)"
        self.query_one(EventLog).border_title = "events"
        self.query_one(PeersTable).focus()
        self.render_state()
        self.source.start(self._deliver)

    def _deliver(self, snapshot: Snapshot) -> None:
        """Called by the source, from any thread."""
        self.post_message(SwarmUpdated(snapshot))

    def on_unmount(self) -> None:
        self.source.stop()

    # -- data in -----------------------------------------------------------------------------

    def on_swarm_updated(self, message: SwarmUpdated) -> None:
        self.state.ingest(message.snapshot)
        if not self.paused:
            self.render_state()

    def on_log_line(self, message: LogLine) -> None:
        self.state.note("log", f"{message.level.lower()}: {message.text}")
        if not self.paused:
            self.query_one(EventLog).update_from(self.state)

    def on_stop_requested(self, _message: StopRequested) -> None:
        self.exit()

    def on_terminal_gone(self, _message: TerminalGone) -> None:
        self.exit(return_code=128 + signal.SIGHUP)  # as after the hangup that usually comes with it

    def render_state(self) -> None:
        """Every widget of the main view (and the detail view, when open) renders from the state."""
        state = self.state
        self.island_colors.assign(state)
        table = self.query_one(PeersTable)
        table.update_from(state, self.island_colors)
        table.border_title = f"islands ({table.sort_label()})"
        self.query_one(SwarmHeader).update_from(state, run_id=self.source.run_id, paused=self.paused)
        self.query_one(LossChart).update_from(state, self.island_colors)
        self.query_one(ThroughputChart).update_from(state, self.island_colors)
        self.query_one(EventLog).update_from(state)
        if isinstance(self.screen, DetailScreen):
            self.screen.update_from(state, self.island_colors)

    # -- user actions ------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Sorting only means something on the main view (hidden from the footer elsewhere)."""
        if action in ("sort", "reverse") and self.screen is not self.screen_stack[0]:
            return False
        return True

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        if message.row_key.value is not None:
            self.push_screen(DetailScreen(message.row_key.value))

    def on_data_table_header_selected(self, message: DataTable.HeaderSelected) -> None:
        self.query_one(PeersTable).sort_by(str(message.column_key.value))
        self.render_state()

    def action_sort(self) -> None:
        table = self.query_one(PeersTable)
        keys = [k for k, _ in COLUMNS]
        table.sort_by(keys[(keys.index(table.sort_column) + 1) % len(keys)], reverse=table.reverse)
        self.render_state()

    def action_reverse(self) -> None:
        table = self.query_one(PeersTable)
        table.sort_by(table.sort_column, reverse=not table.reverse)
        self.render_state()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.render_state()  # shows the paused mark now, or catches up on resume

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_interrupt(self) -> None:
        self.exit(return_code=130)


def make_app(source: Source, **state_options) -> DashboardApp:
    """The dashboard for `source`; `state_options` go to `SwarmState` (expiry defaults to the source's)."""
    state_options.setdefault("expiry", source.expiry)
    return DashboardApp(source, SwarmState(**state_options))
