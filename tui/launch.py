"""Running the dashboard in a terminal: `run_dashboard(source)` and `should_use_dashboard()`.

`run_dashboard` is what the `dashboard` command and the demo call. While the app owns the
terminal, log lines on stderr would tear its screen apart, so the root logger's terminal handlers
are set aside and warnings go to the event log instead; they are put back when the app exits.
`stop_event` lets a caller (the demo, when its islands are done) close the dashboard from outside.
SIGTERM and SIGHUP (a closed terminal) close it the same way, so that the source, and with it the
observer process, is stopped before the process ends; `run_app` then returns 128 + the signal.
After a hangup the terminal's file descriptors are pointed at /dev/null first: Textual writes to
the terminal as it exits (a write that fails anyway ends the app the same way: `tui.driver`).
Textual's SIGTSTP and SIGCONT handlers are put back when the app returns: left in place, a SIGCONT
(which a closed terminal sends with SIGHUP) restarted a driver whose app was gone.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import IO, Mapping

from p2p_diloco.terminal import leave_terminal
from p2p_diloco.tui.source import Source

logger = logging.getLogger(__name__)


def should_use_dashboard(stream: IO | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """True when a person is watching: `stream` (stdout) is a terminal, not CI, not a dumb terminal."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return False
    if environ.get("TERM", "") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real file
        return False


_NAMES = {logging.WARNING: "WARNING", logging.ERROR: "ERROR", logging.CRITICAL: "CRITICAL"}


class _ToApp(logging.Handler):
    """Sends log records to the app as `LogLine` messages (thread-safe)."""

    def __init__(self, app) -> None:
        super().__init__(logging.WARNING)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        from p2p_diloco.tui.messages import LogLine

        try:
            # by number, not `levelname`: libraries rename levels (hivemind calls WARNING "WARN")
            level = _NAMES.get(record.levelno, record.levelname)
            self.app.post_message(LogLine(level, record.getMessage()))
        except Exception:
            self.handleError(record)


def _terminal_handlers(root: logging.Logger) -> list[logging.Handler]:
    out = []
    for h in root.handlers:
        stream = getattr(h, "stream", None)
        if isinstance(h, logging.StreamHandler) and stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__):
            out.append(h)
    return out


_DRIVER_SIGNALS = (signal.SIGTSTP, signal.SIGCONT)
"""What Textual's driver handles while the app runs (Ctrl+Z and `fg`) and leaves installed after it."""


def run_dashboard(source: Source, stop_event: threading.Event | None = None, **state_options) -> int:
    """Show the dashboard for `source` until the user quits or `stop_event` is set; returns the exit code."""
    from p2p_diloco.tui.app import make_app

    return run_app(make_app(source, **state_options), stop_event)


def run_app(app, stop_event: threading.Event | None = None) -> int:
    """Run a dashboard app made by `make_app` in this terminal (see the module docstring)."""
    from p2p_diloco.tui.messages import StopRequested

    root = logging.getLogger()
    moved = _terminal_handlers(root)
    bridge = _ToApp(app)
    for h in moved:
        root.removeHandler(h)
    root.addHandler(bridge)
    done = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame) -> None:  # noted: the thread below asks the app to leave
        if signum == signal.SIGHUP:
            leave_terminal()
        received.append(signum)

    def watch() -> None:  # asks again until the app is gone: a message posted before it runs is lost
        while not done.wait(0.2):
            if received or (stop_event is not None and stop_event.is_set()):
                app.post_message(StopRequested())

    threading.Thread(target=watch, name="dashboard-stop", daemon=True).start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.getsignal(sig) for sig in _DRIVER_SIGNALS}  # Textual's driver takes them
        taken = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) != signal.SIG_IGN]
        previous.update({sig: signal.signal(sig, on_signal) for sig in taken})
    try:
        app.run()
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, and it cannot be put back
                signal.signal(sig, handler)
        done.set()
        root.removeHandler(bridge)
        for h in moved:
            root.addHandler(h)
        app.source.stop()
    return 128 + received[0] if received else app.return_code or 0
