"""The Textual dashboard of a p2p-diloco swarm; it reads discovery records and never imports torch.

`make_app(source)` builds the app for a source (`MembershipSource` for a live run, `ReplaySource`
for a fixed series); `run_dashboard(source)` runs it in the terminal; `should_use_dashboard()`
says whether a terminal is there to run it in. Textual is imported only by `make_app` and the app
modules, so `from tui import should_use_dashboard` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from p2p_diloco.tui.launch import run_app, run_dashboard, should_use_dashboard
from p2p_diloco.tui.source import MembershipSource, ReplaySource, Snapshot, Source
from p2p_diloco.tui.state import SwarmState

if TYPE_CHECKING:
    from p2p_diloco.tui.app import DashboardApp, make_app

__all__ = ["DashboardApp", "MembershipSource", "ReplaySource", "Snapshot", "Source", "SwarmState", "make_app",
           "run_app", "run_dashboard", "should_use_dashboard"]


def __getattr__(name: str) -> Any:
    if name in ("make_app", "DashboardApp"):
        from p2p_diloco.tui import app

        return getattr(app, name)
    raise AttributeError(f"module 'tui' has no attribute {name!r}")
