"""No process is left behind when a command ends from outside: a closed terminal, a hangup.

The demo runs in a pseudo-terminal whose session it leads, as in a terminal window; closing the
terminal (its master side) sends it SIGHUP. Its bootstrap node and islands run in sessions of their
own, each with a DHT process and a libp2p daemon (p2pd), so no signal from the terminal reaches them:
only the demo can stop them. Every process is found by its session id in /proc (Linux), which the
DHT processes and daemons share with the node or island that started them.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from discovery_harness import free_port_pair

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _stat(pid: int) -> dict | None:
    """State, parent, session and command of a process; None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if fields[0] in "ZX":
        return None
    return {"ppid": int(fields[1]), "sid": int(fields[3]), "cmd": cmdline}


def _processes() -> dict[int, dict]:
    return {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _stat(int(d))) is not None}


def _in_sessions(sids: set[int]) -> dict[int, dict]:
    return {pid: s for pid, s in _processes().items() if s["sid"] in sids}


def _wait_gone(sids: set[int], timeout: float) -> dict[int, dict]:
    """Wait until no process is left in these sessions; returns those left after `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := _in_sessions(sids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill_sessions(sids: set[int]) -> None:
    for pid in _in_sessions(sids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _take_terminal() -> None:
    """In the child, after setsid: make stdin (the pty's slave side) its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _drain(master: int, screen: bytearray) -> None:
    try:
        while chunk := os.read(master, 65536):  # what the demo prints: read, so it never blocks
            screen += chunk
    except (BlockingIOError, OSError):
        pass


def _open_terminal() -> tuple[int, int]:
    """A 120x36 pseudo-terminal (master, slave), its master side non-blocking."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    os.set_blocking(master, False)
    return master, slave


def _text(screen: bytearray) -> str:
    return re.sub(r"\x1b\[[0-9;?<>=$]*[A-Za-z~]", "", screen.decode(errors="replace"))


def _wait_drawn(proc, master: int, screen: bytearray, timeout: float) -> None:
    """Read the terminal until the dashboard has drawn its charts."""
    deadline = time.monotonic() + timeout
    while "loss per island" not in _text(screen):
        assert proc.poll() is None and time.monotonic() < deadline, _text(screen)[-3000:]
        _drain(master, screen)
        time.sleep(0.1)


def _children_sessions(pid: int) -> set[int]:
    return {child for child, s in _processes().items() if s["ppid"] == pid}


DASHBOARD_ENV = {"TERM": "xterm-256color", "CI": ""}
"""What a person's terminal has (the suite may run under CI, where the demo shows no dashboard)."""


def _hang_up(master: int, sessions: set[int], typed: bytes = b"") -> None:
    """Type `typed`, close the terminal at once (its master side: SIGHUP, with SIGCONT, to the leader
    of its session), and check that no process of `sessions` is left 15 s later."""
    if typed:
        os.write(master, typed)
    os.close(master)
    closed = time.monotonic()
    left = _wait_gone(sessions, 15)
    assert not left, f"still running {time.monotonic() - closed:.1f} s after the hangup: {left}"


def _rounds(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sum(1 for r in rows if "round" in r)


@pytest.mark.timeout(150)
def test_closing_the_demos_terminal_ends_every_process_it_started(procs, tmp_path):
    workdir = tmp_path / "demo"
    master, slave = os.openpty()
    os.set_blocking(master, False)
    sessions: set[int] = set()
    screen = bytearray()
    try:
        demo = procs.python("-m", "p2p_diloco", "demo", "--islands", "2", "--minutes", "2", "--json", "--device", "cpu",
                            "--workdir", str(workdir), stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=_take_terminal)
        os.close(slave)
        sessions.add(demo.pid)
        deadline = time.monotonic() + 100
        while min(_rounds(workdir / f"island-{k}") for k in range(2)) < 1:
            assert demo.poll() is None and time.monotonic() < deadline, screen[-3000:].decode(errors="replace")
            _drain(master, screen)
            time.sleep(0.2)
        children = [pid for pid, s in _processes().items() if s["ppid"] == demo.pid]
        sessions |= set(children)
        running = _in_sessions(sessions)
        daemons = [pid for pid, s in running.items() if "p2pd" in s["cmd"]]
        # the demo, the bootstrap node and two islands, each of the last three with a DHT process and a p2pd
        assert len(children) == 3 and all(running[c]["sid"] == c for c in children), running
        assert len(daemons) == 3 and len(running) >= 10, running

        terminal, master = master, -1
        _hang_up(terminal, sessions)
        assert demo.wait(5) == 128 + signal.SIGHUP
    finally:
        if master >= 0:
            os.close(master)
        _kill_sessions(sessions)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["serving", "starting"])
def test_bootstrap_stops_its_dht_process_and_daemon_on_sighup(procs, tmp_path, when):
    """SIGHUP to the bootstrap process alone: its DHT process and p2pd get nothing, it must stop them.
    `starting`: the hangup comes as the DHT node starts (its first child: torch's shared-memory
    manager, which hivemind's DHT makes torch start, or the DHT process); the node stops it once up."""
    addr_file, log = tmp_path / "addrs", tmp_path / "bootstrap.log"
    boot = procs.python("-m", "p2p_diloco", "bootstrap", "--port", "0", "--identity", str(tmp_path / "bootstrap.key"),
                        "--addr-file", str(addr_file), stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        deadline = time.monotonic() + 40
        if when == "serving":
            while not addr_file.exists():
                assert boot.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            running = _in_sessions({boot.pid})
            assert len(running) == 3 and sum("p2pd" in s["cmd"] for s in running.values()) == 1, running
        else:
            while not any(s["ppid"] == boot.pid for s in _in_sessions({boot.pid}).values()):
                assert boot.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
        sent = time.monotonic()
        os.kill(boot.pid, signal.SIGHUP)
        assert boot.wait(10) == 0, log.read_text()[-3000:]
        left = _wait_gone({boot.pid}, max(0.5, sent + 10 - time.monotonic()))
        assert not left, f"still running {time.monotonic() - sent:.1f} s after SIGHUP: {left}"
        assert "bootstrap node stopped" in log.read_text()
        assert addr_file.exists() == (when == "serving")  # one stopped while starting announced nothing
    finally:
        _kill_sessions({boot.pid})


@pytest.mark.timeout(90)
def test_quitting_the_demos_dashboard_as_its_terminal_closes_ends_every_process(procs, tmp_path):
    """`q`, and the terminal closed right after (a window shut): the demo stops its islands and exits,
    however Textual's threads stood when the hangup came (it used to hang in interpreter shutdown)."""
    master, slave = _open_terminal()
    sessions: set[int] = set()
    screen = bytearray()
    try:
        demo = procs.python("-m", "p2p_diloco", "demo", "--islands", "2", "--minutes", "1", "--device", "cpu",
                            "--workdir", str(tmp_path / "demo"), stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=_take_terminal, env=DASHBOARD_ENV)
        os.close(slave)
        sessions.add(demo.pid)
        _wait_drawn(demo, master, screen, 60)
        deadline = time.monotonic() + 10
        while len(sessions) < 5 and time.monotonic() < deadline:  # the observer starts as the dashboard draws
            sessions |= _children_sessions(demo.pid)
            time.sleep(0.1)
        # the demo, its bootstrap node, two islands and the dashboard's observer process
        assert len(sessions) == 5, _in_sessions(sessions)
        terminal, master = master, -1
        _hang_up(terminal, sessions, b"q")
        assert demo.wait(5) == 128 + signal.SIGHUP
    finally:
        if master >= 0:
            os.close(master)
        _kill_sessions(sessions)


@pytest.mark.timeout(60)
def test_quitting_the_dashboard_as_its_terminal_closes_ends_it_and_its_observer(procs, tmp_path):
    """`p2p-diloco dashboard`, `q` and the terminal closed at once, while its observer process (a session
    of its own) still tries a bootstrap node that does not answer: both are gone soon after."""
    master, slave = _open_terminal()
    sessions: set[int] = set()
    screen = bytearray()
    try:
        board = procs.python("-m", "p2p_diloco", "dashboard", "--discovery", "zmq", "--run-id", "quiet",
                             "--bootstrap", f"tcp://127.0.0.1:{free_port_pair()}", stdin=slave, stdout=slave,
                             stderr=slave, preexec_fn=_take_terminal, env=DASHBOARD_ENV)
        os.close(slave)
        sessions.add(board.pid)
        _wait_drawn(board, master, screen, 30)
        deadline = time.monotonic() + 10
        while not (observer := _children_sessions(board.pid)):
            assert time.monotonic() < deadline, "the dashboard started no observer process"
            time.sleep(0.1)
        sessions |= observer
        terminal, master = master, -1
        _hang_up(terminal, sessions, b"q")
        # `q` read before the hangup (its default action once the app is gone), or the hangup first
        assert board.wait(5) in (0, -signal.SIGHUP, 128 + signal.SIGHUP)
    finally:
        if master >= 0:
            os.close(master)
        _kill_sessions(sessions)
