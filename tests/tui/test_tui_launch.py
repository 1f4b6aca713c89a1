"""`run_dashboard` in a real (pseudo-)terminal, stopped from outside, and warnings routed to the event log."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import signal
import struct
import termios
import threading
import time

import pytest
from conftest import run_app, until
from p2p_diloco.tui import ReplaySource, make_app
from p2p_diloco.tui.launch import _ToApp
from timeline import EXPIRY, timeline

CHILD = """
import json, logging, sys, threading, time
sys.path.insert(0, {tests!r})
from timeline import EXPIRY, timeline
from p2p_diloco.tui import ReplaySource, make_app
from p2p_diloco.tui.launch import run_app
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
before = list(logging.getLogger().handlers)
source = ReplaySource.from_timeline(timeline(), expiry=EXPIRY, interval=0.05)
stop = threading.Event()
def later():  # once the dashboard owns the terminal (its import can take a while on a busy machine)
    while not any(type(h).__name__ == "_ToApp" for h in logging.getLogger().handlers):
        time.sleep(0.05)
    time.sleep(1.0)
    logging.getLogger("p2p_diloco.test").warning("a warning while the dashboard runs")
    time.sleep(2.0)
    stop.set()
threading.Thread(target=later, daemon=True).start()
t0 = time.monotonic()
app = make_app(source)
code = run_app(app, stop_event=stop)
result = dict(code=code, seconds=time.monotonic() - t0, restored=logging.getLogger().handlers == before,
              source_stopped=not source._thread.is_alive(), snapshots=app.state.snapshots,
              logged=[e.text for e in app.state.events if e.kind == "log"])
open({out!r}, "w").write(json.dumps(result))
"""


DRAWING = """
import json, os, signal, sys, threading, time
sys.path.insert(0, {tests!r})
from timeline import EXPIRY, timeline
from p2p_diloco.tui import ReplaySource, make_app
from p2p_diloco.tui.launch import run_app
source = ReplaySource.from_timeline(timeline(), expiry=EXPIRY, interval=0.05)  # it draws all the time
stop = threading.Event()
if {stop_after} is not None:
    threading.Timer({stop_after}, stop.set).start()
t0 = time.monotonic()
code = run_app(make_app(source), stop_event=stop)
seconds = time.monotonic() - t0
os.kill(os.getpid(), signal.SIGCONT)  # `fg`, or a closed terminal's, after the app
time.sleep(0.2)
threads = [t.name for t in threading.enumerate() if t.name.startswith("textual") and not t.daemon]
open({out!r}, "w").write(json.dumps(dict(code=code, seconds=seconds, threads=threads)))
"""


def _take_terminal() -> None:
    """In the child, after setsid: make stdin (the pty's slave side) its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _drawing(procs, tmp_path, stop_after: float | None, controlling: bool = False):
    """A dashboard that redraws all the time in a 120x36 pty; returns (process, master, result file)."""
    out = tmp_path / "result.json"
    code = DRAWING.format(tests=os.path.dirname(__file__), out=str(out), stop_after=stop_after)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    os.set_blocking(master, False)
    proc = procs.python("-c", code, stdin=slave, stdout=slave, stderr=slave, env={"TERM": "xterm-256color"},
                        preexec_fn=_take_terminal if controlling else None)
    os.close(slave)
    return proc, master, out


def _read_until(proc, master: int, text: str, timeout: float) -> bytearray:
    screen = bytearray()
    deadline = time.monotonic() + timeout
    while text not in re.sub(r"\x1b\[[0-9;?<>=$]*[A-Za-z~]", "", screen.decode(errors="replace")):
        assert proc.poll() is None and time.monotonic() < deadline, screen[-2000:].decode(errors="replace")
        try:
            screen += os.read(master, 65536)
        except (BlockingIOError, OSError):
            time.sleep(0.05)
    return screen


@pytest.mark.timeout(40)
@pytest.mark.parametrize("controlling", [True, False], ids=["hangup", "writes-fail"])
def test_a_dashboard_whose_terminal_vanishes_while_it_draws_exits(procs, tmp_path, controlling):
    """The terminal closed under a drawing dashboard: with its hangup (SIGHUP and SIGCONT, as to the
    leader of the terminal's session), or, not its controlling terminal, with nothing but failing writes.
    Either ends the app as a hangup does (129) and the process exits, no Textual thread left to hold it."""
    proc, master, out = _drawing(procs, tmp_path, stop_after=None, controlling=controlling)
    try:
        _read_until(proc, master, "loss per island", 30)
    finally:
        os.close(master)
    closed = time.monotonic()
    assert proc.wait(15) == 0
    result = json.loads(out.read_text())
    assert result["code"] == 128 + signal.SIGHUP and result["threads"] == []
    assert time.monotonic() - closed < 15


@pytest.mark.timeout(40)
def test_sigcont_neither_restarts_nor_breaks_the_dashboard(procs, tmp_path):
    """SIGCONT without a suspension, to the running app and after it: Textual's driver restarted its
    application mode on each (a second input thread; after the app, `RuntimeError` into the caller)."""
    proc, master, out = _drawing(procs, tmp_path, stop_after=4.0)
    try:
        _read_until(proc, master, "loss per island", 30)
        proc.send_signal(signal.SIGCONT)
        while proc.poll() is None:
            try:
                os.read(master, 65536)
            except (BlockingIOError, OSError):
                time.sleep(0.05)
    finally:
        os.close(master)
    assert proc.wait(10) == 0
    result = json.loads(out.read_text())
    assert result["code"] == 0 and result["threads"] == [] and result["seconds"] < 20


@pytest.mark.timeout(90)
def test_run_dashboard_in_a_terminal_until_the_caller_stops_it(procs, tmp_path):
    out = tmp_path / "result.json"
    code = CHILD.format(tests=os.path.dirname(__file__), out=str(out))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))  # a 120x36 terminal
    os.set_blocking(master, False)
    try:
        proc = procs.python("-c", code, stdin=slave, stdout=slave, stderr=slave, env={"TERM": "xterm-256color"})
        os.close(slave)
        screen = bytearray()
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                screen += os.read(master, 65536)  # the app's output: drain it so it never blocks
            except (BlockingIOError, OSError):
                time.sleep(0.05)
        assert proc.wait(10) == 0, screen[-2000:].decode(errors="replace")
    finally:
        os.close(master)
    result = json.loads(out.read_text())
    assert result["code"] == 0 and result["restored"] and result["source_stopped"]
    assert 3.0 <= result["seconds"] < 40 and result["snapshots"] > 0
    assert result["logged"] == ["warning: a warning while the dashboard runs"]  # into the event log...
    text = re.sub(r"\x1b\[[0-9;?<>=$]*[A-Za-z~]", "", screen.decode(errors="replace"))
    assert "WARNING:p2p_diloco.test" not in text  # ...not over the screen: stderr's handler was set aside
    assert "p2p-diloco" in text and "loss per island" in text


def test_warnings_logged_while_running_appear_in_the_event_log():
    app = make_app(ReplaySource.from_timeline(timeline(3), expiry=EXPIRY))
    log = logging.getLogger("p2p_diloco.test_bridge")

    async def scenario(pilot):
        handler = _ToApp(app)
        log.addHandler(handler)
        try:
            log.info("not shown: below warning")
            threading.Thread(target=log.warning, args=("peer %s refused: %s", "abc", "bad digest")).start()
            await until(pilot, lambda: any(e.kind == "log" for e in app.state.events), 5, "the warning in the log")
        finally:
            log.removeHandler(handler)
        logged = [e.text for e in app.state.events if e.kind == "log"]
        assert logged == ["warning: peer abc refused: bad digest"]

    run_app(scenario, app)
