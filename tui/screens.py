"""Screens pushed over the main view: one island's detail and history, and the help page.

`DetailScreen` follows one island by peer id; it keeps showing the last known record after the
island is gone (marked as such), because "what was it doing when it vanished" is the question an
operator opens it for.
"""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from p2p_diloco.tui import format as fmt
from p2p_diloco.tui.plot import Series
from p2p_diloco.tui.state import IslandView, SwarmState
from p2p_diloco.tui.widgets import STATE_STYLE, EventLog, IslandColors, PlotPanel


class IslandPlot(PlotPanel):
    """One quantity of one island over time."""

    SWARM_TIME = False

    def __init__(self, peer_id: str, field: str, title: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.peer_id, self.field = peer_id, field
        self.border_title = title

    def draw(self, state, colors):
        view = state.islands.get(self.peer_id)
        history = list(view.history) if view else []
        if self.field == "link":
            up = Series([(s.t, s.upload_bps) for s in history], "green")
            down = Series([(s.t, s.download_bps) for s in history], "dodger_blue1")
            now = history[-1] if history else None
            legend = Text.assemble(("■ up ", "green"), fmt.rate(now and now.upload_bps),
                                   ("  ■ down ", "dodger_blue1"), fmt.rate(now and now.download_bps))
            return ([up, down] if history else []), 0.0, legend
        points = [(s.t, getattr(s, self.field)) for s in history if getattr(s, self.field) is not None]
        last = points[-1][1] if points else None
        shown = fmt.loss(last) if self.field == "loss" else fmt.si(last)
        floor = None if self.field == "loss" else 0.0  # rates read against zero
        return ([Series(points, colors(self.peer_id))] if points else []), floor, Text.assemble(("now ", "dim"), shown)

    def label(self, y: float) -> str:
        return f"{y:.3f}" if self.field == "loss" else fmt.si(y)


class DetailScreen(Screen):
    """One island: every field of its record, its history as charts, and its events."""

    BINDINGS: ClassVar = [Binding("escape", "app.pop_screen", "Back"), Binding("q", "app.quit", "Quit")]
    DEFAULT_CSS = """
    DetailScreen #detail-head { height: 2; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    DetailScreen #fields { width: 46; border: round $primary; padding: 0 1; }
    DetailScreen IslandPlot { height: 1fr; border: round $primary; padding: 0 1; }
    DetailScreen EventLog { height: 7; border: round $primary; padding: 0 1; }
    """

    def __init__(self, peer_id: str) -> None:
        super().__init__()
        self.peer_id = peer_id

    def compose(self) -> ComposeResult:
        yield Static(id="detail-head")
        with Horizontal():
            yield Static(id="fields")
            with Vertical():
                yield IslandPlot(self.peer_id, "loss", "loss")
                yield IslandPlot(self.peer_id, "tokens_per_s", "tokens/s")
                yield IslandPlot(self.peer_id, "link", "link rates")
        yield EventLog()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#fields").border_title = "record"
        self.query_one(EventLog).border_title = "events of this island"
        self.update_from(self.app.state, self.app.island_colors)

    def update_from(self, state: SwarmState, colors: IslandColors) -> None:
        view = state.islands.get(self.peer_id)
        if view is None:
            self.query_one("#detail-head", Static).update(Text(f"island {self.peer_id}: no longer listed", "dim"))
            return
        self.query_one("#detail-head", Static).update(self.headline(view, colors(self.peer_id)))
        self.query_one("#fields", Static).update(self.fields(state, view))
        for p in self.query(IslandPlot):
            p.update_from(state, colors)
        self.query_one(EventLog).update_from(state, self.peer_id)

    @staticmethod
    def headline(view: IslandView, color: str) -> Text:
        r = view.record
        return Text.assemble(
            ("island ", "dim"), (view.label, f"bold {color}"), (f" {r.peer_id}" if r.name else r.peer_id[len(view.label):], "dim"),
            "  ", (view.shown_state, STATE_STYLE.get(view.shown_state, "")),
            "\n", ("at ", "dim"), fmt.address_cell(r.endpoint, r.reach), ("   version ", "dim"), (f"v{r.version}", "bold"),
            ("   behind ", "dim"), str(view.behind) if view.live else "-", ("   loss ", "dim"), fmt.loss(r.loss),
            ("   lr ", "dim"), fmt.lr(r.lr), ("   elapsed ", "dim"),
            fmt.duration(r.timestamp - r.started_at) if r.started_at else "-", ("   budget ", "dim"),
            fmt.budget(r.budget, r.eta_s))

    @staticmethod
    def fields(state: SwarmState, view: IslandView) -> Table:
        r, now = view.record, state.now
        table = Table.grid(padding=(0, 2))
        table.add_column(style="dim")
        table.add_column()
        rows = [
            ("state", view.shown_state), ("version", f"v{r.version} ({view.behind} behind)" if view.live else f"v{r.version}"),
            ("tokens", fmt.si(r.tokens)), ("tokens/s", fmt.si(r.tokens_per_s)),
            ("utilization", f"{r.utilization:.3f} of its time in inner steps" if r.utilization else "-"),
            ("time spent", r.time_split or "-"),
            ("loss", fmt.loss(r.loss)), ("eval loss", fmt.loss(r.eval_loss)),
            ("upload", fmt.rate(r.upload_bps)), ("download", fmt.rate(r.download_bps)),
            ("sent", fmt.size(r.bytes_sent)), ("received", fmt.size(r.bytes_received)),
            ("reach", fmt.REACH.get(r.reach, r.reach)), ("last partner", state.label_of(r.last_partner)),
            ("refused", f"{r.refused} states, last from {state.label_of(r.last_refused)}" if r.refused else "0"),
            ("alone", r.alone or "no"), ("fetches", r.fetches or "as configured (--exchange state or updates)"),
            ("started", f"{fmt.clock(r.started_at)} ({fmt.duration(now - r.started_at)} ago)" if r.started_at else "-"),
            ("record age", fmt.duration(view.age)),
            ("first seen", f"{fmt.clock(view.first_seen)}"),
            ("samples", str(len(view.history))),
        ]
        if view.gone_at is not None:
            rows.append(("gone", f"{view.gone} at {fmt.clock(view.gone_at)}"))
        for name, value in rows:
            table.add_row(name, value)
        return table


HELP = """\
[b]Keys[/b]
  [b]q[/b] / ctrl+c   quit
  [b]s[/b]            sort by the next column (or click a column header)
  [b]S[/b]            reverse the sort order
  [b]p[/b]            pause the display (data keeps arriving; p resumes)
  [b]enter[/b]        details and history of the highlighted island (escape returns)
  [b]?[/b]            this help

[b]Columns[/b]
  [b]island[/b]   its name (`join --name`, `IslandConfig(name=...)`), else its peer id's first 8 characters
  [b]behind[/b]   versions behind the freshest island ([yellow]yellow[/] past half the max staleness,
           [red]red[/] past it: partners skip that island)
  [b]age[/b]      seconds since the island made its record ([yellow]yellow[/] > stale time, [red]red[/] > twice that)
  [b]up/down[/b]  measured link rates; [b]partner[/b]: the island it last mixed with

[b]Events[/b]
  [b]left[/b]     the record was withdrawn (a clean exit)
  [b]expired[/b]  it vanished after going silent (a crash, a kill, a lost link)
  [b]behind[/b]   an island fell past the max staleness; [b]caught-up[/b] when it is back within it
"""


class HelpScreen(ModalScreen):
    """Keys and column meanings; any of escape, ? or q closes it."""

    BINDINGS: ClassVar = [Binding("escape", "dismiss", "Close"), Binding("question_mark", "dismiss", "Close"),
                          Binding("q", "dismiss", "Close", show=False)]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 104; height: auto; border: round $primary; padding: 1 2; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)
        yield Footer()
