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
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

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

        closed = time.monotonic()
        os.close(master)  # the terminal is closed: SIGHUP to the demo, which leads its session
        master = -1
        left = _wait_gone(sessions, 15)
        assert not left, f"still running {time.monotonic() - closed:.1f} s after the hangup: {left}"
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
