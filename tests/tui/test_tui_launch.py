"""`run_dashboard` in a real (pseudo-)terminal, stopped from outside, and warnings routed to the event log."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
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
