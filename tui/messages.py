"""The dashboard's own Textual messages, as dataclasses in one place.

Background threads (the data source, the logging bridge) never touch widgets: they post one of
these to the app with `post_message`, which is thread-safe, and the app updates the state and the
widgets on its own loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from p2p_diloco.tui.source import Snapshot


@dataclass
class SwarmUpdated(Message):
    """A source delivered a new reading of the member list."""

    snapshot: Snapshot


@dataclass
class LogLine(Message):
    """A warning logged by the library while the dashboard owns the terminal (shown in the event log)."""

    level: str
    text: str


@dataclass
class StopRequested(Message):
    """Someone outside the app (the demo ending) asks it to exit."""


@dataclass
class TerminalGone(Message):
    """The app's terminal was closed under it: a write or read failed (`tui.driver`)."""
