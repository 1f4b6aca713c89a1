"""Watch a run from a child process: the member list, without hivemind or torch in this process.

The DHT back-end needs hivemind, and importing any part of hivemind imports torch (its package
`__init__` loads the whole library): a second of start-up and hundreds of megabytes for a reader
that only shows records. `ObserverProcess` is a `Membership` for such readers (the dashboard): a
child interpreter runs the real observer (`open_membership(config, observer=True)`, with its
fallback from the DHT to ZeroMQ) and reports the member list, and this process only parses it.

The two talk in JSON lines. Child to parent, on stdout:

- `{"type": "ready", "kind": "dht"|"zmq", "peer_id": str}` once the observer is open;
- `{"type": "error", "message": str}` if it could not be opened (the child then exits);
- `{"type": "members", "answered": int, "records": [IslandRecord.to_dict(), ...], "hidden": int,
  "refused": int}` after each read: every `poll` seconds, and at once after a `refresh` request;
  `answered` counts the requests whose read this list includes; `hidden` and `refused` are the
  observer's `sealed_hidden()` and `refused_records()` (sealed records it cannot read or open).

Parent to child, on stdin: first the config, as one line of JSON (not in argv: it may hold the swarm
secret, and argv is visible to every user in `ps`), then `refresh` (read the swarm now). The child
exits when its stdin closes, so it never outlives its parent, however the parent ends (while it is
still opening: at once, with what it started; `cancel` lets the parent kill one that opens). It
runs in its own session, so the terminal's Ctrl+C and hangup reach only the parent, which decides
when it ends; one that does not leave in time is killed with its process group (its DHT process and
p2pd too). Every record is checked again here (`IslandRecord.from_dict`); the child's log lines are
passed on to this process's log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery.membership import Membership
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)

START_S = 20.0
"""Allowance for the child's own start (an interpreter that imports hivemind and torch), on top of
the config's `connect_timeout`."""
EXIT_S = 5.0
"""How long `shutdown` waits for the child to leave cleanly before it is killed."""


class ObserverProcess(Membership):
    """A read-only `Membership` whose back-end runs in a child process (see the module docstring)."""

    def __init__(self, config: DiscoveryConfig, cancel: threading.Event | None = None) -> None:
        """Opens the observer; `cancel` set while it opens gives it up (`DiscoveryError`) within a moment."""
        self.config = config
        self._cond = threading.Condition()
        self._records: dict[str, IslandRecord] = {}
        self._asked = self._answered = 0
        self._hidden = self._refused = 0
        self._hello: dict[str, Any] | None = None
        self._closed = False
        self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                      start_new_session=True)
        try:
            self._proc.stdin.write(json.dumps({**dataclasses.asdict(config), "bootstrap": list(config.bootstrap)}) + "\n")
            self._proc.stdin.flush()
        except OSError:
            pass  # the child died at once: the reader below reports its exit
        threading.Thread(target=self._read, name="observer-out", daemon=True).start()
        threading.Thread(target=self._relay_log, name="observer-log", daemon=True).start()
        cancelled = cancel.is_set if cancel is not None else (lambda: False)
        deadline = time.monotonic() + config.connect_timeout + START_S
        with self._cond:
            while self._hello is None and time.monotonic() < deadline and not cancelled():
                self._cond.wait(0.1)
            hello = self._hello
        if hello is None and cancelled():
            self.shutdown(wait=0)  # still opening, it reads no stdin yet; it has no record to withdraw
            raise DiscoveryError("the observer was closed while it opened")
        if hello is None or hello["type"] != "ready":
            self.shutdown()
            raise DiscoveryError(f"the observer process did not start within {config.connect_timeout + START_S:g} s"
                                 if hello is None else str(hello.get("message", "the observer process exited")))
        self.kind, self._peer_id = str(hello["kind"]), str(hello["peer_id"])

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def announce(self, record: IslandRecord) -> None:
        raise DiscoveryError("an observer cannot announce a record")

    def members(self) -> dict[str, IslandRecord]:
        with self._cond:
            if self._proc.poll() is not None and not self._closed:
                raise DiscoveryError(f"the observer process exited (code {self._proc.returncode})")
            return dict(self._records)

    def refresh(self, timeout: float = 10.0) -> dict[str, IslandRecord]:
        with self._cond:
            self._asked += 1
            target = self._asked
            try:
                self._proc.stdin.write("refresh\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as e:
                raise DiscoveryError("the observer process exited") from e
            self._cond.wait_for(lambda: self._answered >= target or self._proc.poll() is not None, timeout)
        return self.members()

    def sealed_hidden(self) -> int:
        with self._cond:
            return self._hidden

    def refused_records(self) -> int:
        with self._cond:
            return self._refused

    def leave(self) -> None:
        """An observer has no record to withdraw."""

    def shutdown(self, wait: float = EXIT_S) -> None:
        """Close the child's stdin, on which it leaves; kill its process group if it has not after `wait` s."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        try:
            self._proc.stdin.close()  # the child leaves when its stdin closes
        except OSError:
            pass
        try:
            self._proc.wait(wait)
        except subprocess.TimeoutExpired:
            logger.info("the observer process did not leave within %.0f s; killing it", wait)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # its DHT process and p2pd go with it
            except ProcessLookupError:
                pass
            self._proc.wait()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
                if msg.get("type") == "members":
                    records = {r.peer_id: r for r in map(IslandRecord.from_dict, msg["records"])}
                    hidden, refused = int(msg.get("hidden", 0)), int(msg.get("refused", 0))
                    with self._cond:
                        self._records, self._answered = records, int(msg["answered"])
                        self._hidden, self._refused = hidden, refused
                        self._cond.notify_all()
                elif msg.get("type") in ("ready", "error"):
                    with self._cond:
                        self._hello = msg
                        self._cond.notify_all()
            except (ValueError, KeyError, TypeError, DiscoveryError) as e:
                logger.info("ignoring a bad line from the observer process: %s", e)
        with self._cond:
            self._hello = self._hello or {"type": "error", "message": f"it exited (code {self._proc.wait()})"}
            self._cond.notify_all()

    def _relay_log(self) -> None:
        for line in self._proc.stderr:
            if line.strip():
                logger.info("observer: %s", line.rstrip())


def _serve(config: DiscoveryConfig) -> int:
    """The child: open the observer, report the member list until stdin closes."""
    from p2p_diloco.discovery import open_membership

    def emit(msg: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    opened = threading.Event()
    threading.Thread(target=_end_with_parent, args=(os.getppid(), opened), name="observer-parent",
                     daemon=True).start()
    try:
        membership = open_membership(config, observer=True)
    except Exception as e:  # an unreachable bootstrap, a failed daemon: the parent shows why
        emit({"type": "error", "message": str(e) or type(e).__name__})
        return 1
    finally:
        opened.set()
    requests: queue.Queue[str | None] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            requests.put(line.strip())
        requests.put(None)

    threading.Thread(target=read_stdin, name="observer-requests", daemon=True).start()
    answered = 0
    with membership:  # stopped however this ends, a parent gone (BrokenPipeError) included
        emit({"type": "ready", "kind": membership.kind, "peer_id": membership.peer_id})
        while True:
            records = membership.members()
            emit({"type": "members", "answered": answered, "records": [r.to_dict() for r in records.values()],
                  "hidden": membership.sealed_hidden(), "refused": membership.refused_records()})
            try:
                request = requests.get(timeout=config.poll)
            except queue.Empty:
                continue
            if request is None:
                break
            if request == "refresh":
                membership.refresh(config.connect_timeout)
                answered += 1
    return 0


def _end_with_parent(parent: int, opened: threading.Event) -> None:
    """While the observer opens (a bootstrap that does not answer can take a while), it reads no stdin:
    one whose parent is gone then ends at once. It has no record to withdraw; the DHT process and p2pd
    it started share its process group when the parent started it (in a session of its own). (Not
    stdin read in a thread: the DHT process forks meanwhile, and its child would wait for good on the
    lock of the `sys.stdin` that multiprocessing closes.)"""
    while not opened.wait(0.2):
        if os.getppid() != parent:
            if os.getpgrp() == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            os._exit(0)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    line = sys.stdin.readline()
    if not line:
        return 0  # the parent is gone before it sent the config
    fields = json.loads(line)
    try:
        return _serve(DiscoveryConfig(**{**fields, "bootstrap": tuple(fields["bootstrap"])}))
    except BrokenPipeError:  # the parent is gone
        return 0


if __name__ == "__main__":
    sys.exit(main())
