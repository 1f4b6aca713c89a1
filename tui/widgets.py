"""The dashboard's widgets; each renders from a `SwarmState` in `update_from` and holds no data of its own.

`SwarmHeader` (totals and connection), `PeersTable` (one row per island, sortable), `PlotPanel`
and its two charts (loss per island, swarm throughput) and `EventLog`. `IslandColors` gives each
island one colour, used for its id in the table and its line in the loss chart.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable, RichLog, Static

from p2p_diloco.tui import format as fmt
from p2p_diloco.tui.plot import PALETTE, Series, bounds, plot, with_axis
from p2p_diloco.tui.state import IslandView, SwarmState

COLUMNS = (("id", "island"), ("address", "address"), ("state", "state"), ("version", "version"), ("behind", "behind"),
           ("age", "age"), ("tokens_per_s", "tok/s"), ("utilization", "util"), ("loss", "loss"), ("upload", "up"), ("download", "down"),
           ("partner", "partner"))
"""(column key, label) of the peers table; the keys are `tui.state.SORT_KEYS`."""
NUMERIC = {"version", "behind", "age", "tokens_per_s", "utilization", "loss", "upload", "download"}
STATE_STYLE = {"joining": "yellow", "training": "green", "alone": "bold yellow", "syncing": "cyan", "leaving": "magenta",
               "left": "dim", "expired": "bold red"}
LEVEL_STYLE = ("", "yellow", "bold red")
EVENT_STYLE = {"refused": "bold yellow", "alone": "bold yellow", "fetches": "cyan", "join": "green", "rejoin": "green", "state": "cyan", "leaving": "magenta", "left": "magenta",
               "expired": "bold red", "behind": "yellow", "caught-up": "green", "connected": "green",
               "disconnected": "bold red", "log": "yellow"}


class IslandColors:
    """A stable colour per island, handed out in the order islands are first seen."""

    def __init__(self) -> None:
        self._given: dict[str, str] = {}

    def __call__(self, peer_id: str) -> str:
        if peer_id not in self._given:
            self._given[peer_id] = PALETTE[len(self._given) % len(PALETTE)]
        return self._given[peer_id]

    def assign(self, state: SwarmState) -> None:
        for view in sorted(state.islands.values(), key=lambda v: (v.first_seen, v.peer_id)):
            self(view.peer_id)


class SwarmHeader(Static):
    """Two lines: run, connection and time; then the swarm totals."""

    DEFAULT_CSS = "SwarmHeader { height: 2; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }"

    def update_from(self, state: SwarmState, *, run_id: str, paused: bool = False) -> None:
        dot, style = {"connected": ("●", "green"), "disconnected": ("●", "bold red")}.get(state.status, ("◌", "yellow"))
        top = Text.assemble(("p2p-diloco", "bold"), "  ", (fmt.clock(state.now) if state.now else "--:--:--", "dim"),
                            "  run ", (run_id, "bold"), "  ", (f"{dot} {state.status}", style))
        if state.status == "connected" and state.kind:
            top.append(f" via {state.kind}", "dim")
        elif state.detail:
            top.append(f": {state.detail}", style if state.status == "disconnected" else "dim")
        if paused:
            top.append("  ⏸ paused (p resumes)", "bold yellow")
        t = state.totals()
        bottom = Text.assemble(
            (f"{t.live} live", "bold"), (f" / {t.seen} seen", "dim"),
            ("   ", ""), (f"{fmt.si(t.tokens_per_s)} tok/s", "bold"),
            ("   loss best ", "dim"), (fmt.loss(t.best_loss), "bold"), (" mean ", "dim"), (fmt.loss(t.mean_loss), "bold"),
            ("   freshest ", "dim"), (f"v{t.freshest_version}", "bold"),
            ("   moved ", "dim"), (fmt.size(t.bytes_moved), "bold"),
            ("   run time ", "dim"), (fmt.duration(t.run_seconds), "bold"),
        )
        self.update(Text("\n").join([top, bottom]))  # one line each (CSS nowrap): a long reason is cut short


class PeersTable(DataTable):
    """One row per island; rows keep their cursor across updates; a click on a header sorts by it."""

    BINDINGS: ClassVar = [Binding("enter", "select_cursor", "Details")]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.sort_column, self.reverse = "id", False
        self._order: list[str] = []

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(Text(label, justify="right" if key in NUMERIC else "left"), key=key)

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        """Sort by `column`; choosing the current column again flips the order."""
        if reverse is None:
            reverse = not self.reverse if column == self.sort_column else False
        self.sort_column, self.reverse = column, reverse

    def sort_label(self) -> str:
        label = dict(COLUMNS)[self.sort_column]
        return f"sorted by {label} {'▼' if self.reverse else '▲'}"

    def update_from(self, state: SwarmState, colors: IslandColors) -> None:
        views = state.sorted_views(self.sort_column, self.reverse)
        order = [v.peer_id for v in views]
        rows = {v.peer_id: self.cells(state, v, colors(v.peer_id)) for v in views}
        if order == self._order:
            for pid in order:
                for (key, _), cell in zip(COLUMNS, rows[pid]):
                    self.update_cell(pid, key, cell, update_width=True)
            return
        keep = self._order[self.cursor_row] if self._order and 0 <= self.cursor_row < len(self._order) else None
        self.clear()
        for pid in order:
            self.add_row(*rows[pid], key=pid)
        self._order = order
        if keep in order:
            self.move_cursor(row=order.index(keep), animate=False)

    @staticmethod
    def cells(state: SwarmState, v: IslandView, color: str) -> list[Text]:
        r, dim = v.record, "" if v.live else "dim"
        right = dict(justify="right", style=dim)
        behind = Text(str(v.behind) if v.live else "-", justify="right",
                      style=LEVEL_STYLE[state.behind_level(v)] if v.live else "dim")
        age = Text(fmt.duration(v.age), justify="right", style=LEVEL_STYLE[state.age_level(v)] if v.live else "dim")
        return [
            Text(fmt.label_cell(v.label), style=f"bold {color}" if v.live else f"dim {color}"),
            Text(fmt.address_cell(r.endpoint, r.reach), style=dim or ("yellow" if r.reach == "outbound" else "")),
            Text(v.shown_state, style=STATE_STYLE.get(v.shown_state, "")),
            Text(str(r.version), **right), behind, age,
            Text(fmt.si(r.tokens_per_s), **right), Text(fmt.share(r.utilization), **right),
            Text(fmt.loss(r.loss), **right),
            Text(fmt.rate(r.upload_bps), **right), Text(fmt.rate(r.download_bps), **right),
            Text(fmt.label_cell(state.label_of(r.last_partner)), style=dim),
        ]


class PlotPanel(Static):
    """A braille chart with a y axis and a one-line legend; subclasses say what to draw."""

    AXIS = 7
    EMPTY = "waiting for data…"
    SWARM_TIME = True
    """Span the x axis over the whole swarm history (not just this chart's points)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._last: tuple[SwarmState, IslandColors] | None = None

    def draw(self, state: SwarmState, colors: IslandColors) -> tuple[list[Series], float | None, Text]:
        """The series, a y floor (None: fit the data) and the legend."""
        raise NotImplementedError

    def update_from(self, state: SwarmState, colors: IslandColors) -> None:
        self._last = (state, colors)
        series, floor, legend = self.draw(state, colors)
        width = max(4, self.content_size.width - self.AXIS - 2)
        height = max(1, self.content_size.height - 1)
        box = bounds(series, floor)
        if box is None:
            self.update(Text(self.EMPTY, style="dim"))
            return
        x0, x1, y0, y1 = box
        if self.SWARM_TIME and state.history and state.now > state.history[0].t:
            x0, x1 = state.history[0].t, state.now  # every swarm chart spans the same time
            box = (x0, x1, y0, y1)
        lines = with_axis(plot(series, width, height, box), self.label(y1), self.label(y0), self.AXIS)
        self.border_subtitle = f"last {fmt.duration(x1 - x0)}"
        self.update(Text("\n").join([*lines, legend]))

    def label(self, y: float) -> str:
        return f"{y:.3g}"

    def on_resize(self) -> None:
        if self._last is not None:
            self.update_from(*self._last)


class LossChart(PlotPanel):
    """Training loss of every island over time, on one scale, in the island's colour."""

    EMPTY = "no island has reported a loss yet"

    def draw(self, state, colors):
        series, legend = [], Text()
        for v in sorted(state.islands.values(), key=lambda v: (v.first_seen, v.peer_id)):
            points = [(s.t, s.loss) for s in v.history if s.loss is not None]
            if points:
                series.append(Series(points, colors(v.peer_id)))
            if v.live:
                legend.append("■ ", colors(v.peer_id)).append(f"{fmt.label_cell(v.label)} {fmt.loss(v.record.loss)}  ")
        return series, None, legend


class ThroughputChart(PlotPanel):
    """Total tokens per second of the live islands over time."""

    def draw(self, state, colors):
        points = [(s.t, s.tokens_per_s) for s in state.history]
        peak = max((y for _, y in points), default=0.0)
        t = state.totals()
        legend = Text.assemble(("now ", "dim"), f"{fmt.si(t.tokens_per_s)} tok/s", ("  peak ", "dim"), fmt.si(peak),
                               ("  islands ", "dim"), str(t.live))
        return [Series(points, "bold green")] if points else [], 0.0, legend

    def label(self, y: float) -> str:
        return fmt.si(y)


class EventLog(RichLog):
    """The event log: appends the state's events it has not shown yet."""

    DEFAULT_CSS = "EventLog { overflow-y: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=500, wrap=False, auto_scroll=True, **kwargs)
        self._shown = 0

    def update_from(self, state: SwarmState, peer_id: str | None = None) -> None:
        for e in state.events:
            if e.seq <= self._shown or (peer_id is not None and e.peer_id != peer_id):
                continue
            self.write(Text.assemble((fmt.clock(e.t), "dim"), " ", (f"{e.kind:<12}", EVENT_STYLE.get(e.kind, "")), " ", e.text))
            self._shown = e.seq
