"""The membership interface both discovery back-ends implement, and the facade they share.

Both back-ends follow hivemind's `ProgressTracker`: one record per peer under a shared per-run
key, the peer id as subkey, an expiry that a background thread keeps pushing forward, and a
tombstone (`None`) on a clean leave. `Membership` is what islands, `status` and the dashboard
use; `BackgroundMembership` holds what the two back-ends (`dht`, `peer_exchange`) share: the own
record, leaving, refreshing on demand, shutting down, and the join/leave log of the view.

Plain Python (no hivemind, no torch, no zmq): the factory that picks a back-end is
`p2p_diloco.discovery.open_membership`.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import TYPE_CHECKING

from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import DiscoveryError

if TYPE_CHECKING:
    from p2p_diloco.config import DiscoveryConfig

logger = logging.getLogger(__name__)

SEALED_HINT = "records are sealed with a swarm secret; pass --secret or --secret-file"
"""What `status` and the dashboard say when a run's records are sealed and they hold no secret."""
REFUSED_HINT = "records did not open with the given secret; is it this run's secret?"
"""What they say when records were there but none opened with the secret they were given."""


class Membership(abc.ABC):
    """The live member list of one run, behind a synchronous facade.

    A background thread keeps the own record fresh and the view of the others current; no method
    waits on the network for longer than a short, bounded time.
    """

    kind: str
    """`"dht"` or `"zmq"`."""

    @property
    @abc.abstractmethod
    def peer_id(self) -> str:
        """The id this member announces under (records must carry it)."""

    @abc.abstractmethod
    def announce(self, record: IslandRecord) -> None:
        """Set or replace the own record; it is stored soon and refreshed until `leave`."""

    @abc.abstractmethod
    def members(self) -> dict[str, IslandRecord]:
        """Live members by peer id, own record included; expired and departed ones are absent."""

    @abc.abstractmethod
    def refresh(self, timeout: float = 10.0) -> dict[str, IslandRecord]:
        """Read the member list from the network now (at most `timeout` seconds), then `members()`."""

    @abc.abstractmethod
    def leave(self) -> None:
        """Withdraw the own record so that it disappears from everyone's view at once."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the background work and release sockets and processes (idempotent)."""

    def sealed_hidden(self) -> int:
        """Live records this member sees but cannot read: sealed with a swarm secret it was not
        given (`p2p_diloco.discovery.sealing`). Always 0 for a member that holds a secret."""
        return 0

    def refused_records(self) -> int:
        """Records dropped since the start because they did not open with this member's secret (or
        arrived unsealed in a run with one): an outsider's, another run's, or tampered with."""
        return 0

    def _check_own(self, record: IslandRecord) -> None:
        if not isinstance(record, IslandRecord):
            raise TypeError(f"announce() takes an IslandRecord, got {type(record).__name__}")
        if record.peer_id != self.peer_id:
            raise DiscoveryError(f"record peer_id {record.peer_id!r} is not this member's id {self.peer_id!r}")

    def __enter__(self) -> Membership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def sealed_hint(membership: Membership, records: dict[str, IslandRecord]) -> str:
    """The one line that says why a reader misses islands of a run whose records are sealed:
    `SEALED_HINT` when it holds no secret and some records are sealed, `REFUSED_HINT` when it sees
    nobody and records did not open with its secret; "" otherwise."""
    if membership.sealed_hidden():
        return SEALED_HINT
    return REFUSED_HINT if not records and membership.refused_records() else ""


class BackgroundMembership(Membership):
    """The facade both back-ends share: the own record and leaving, in front of a background thread.

    A subclass calls `__init__` (the shared state below) before it opens its connections, then
    `_start(name)` to run its `_run()` on the background thread. It implements `_live_records()`
    (the others' records, under the lock) and `_request_poll()`. `_kick()` wakes the thread when it
    sleeps on an event; `_announced(first)` runs under the lock when a record is set;
    `_after_stop()` releases what the thread did not own. The thread stores `_record` while
    `_dirty`, sends the tombstone when `_leave_requested`, sets `_left_event` once it is out, counts
    `_polls` (notifying `_poll_done`) as it reads the swarm, and calls `_log_view()` after each read.
    """

    _leave_timeout: float = 5.0
    """How long `leave` waits for the thread to send the tombstone."""
    _join_timeout: float = 10.0
    """How long `shutdown` waits for the thread to stop."""

    def __init__(self, config: DiscoveryConfig, observer: bool) -> None:
        self.config, self.observer = config, observer
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._left_event = threading.Event()
        self._record: IslandRecord | None = None
        self._dirty = self._left = self._leave_requested = False
        self._polls = 0
        self._poll_done = threading.Condition(self._lock)
        self._seen: set[str] = set()
        self._thread: threading.Thread | None = None

    def _start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{name}-{self.peer_id[:8]}", daemon=True)
        self._thread.start()

    @abc.abstractmethod
    def _run(self) -> None:
        """The background thread: owns the back-end's connections until `_stop` is set."""

    @abc.abstractmethod
    def _live_records(self) -> dict[str, IslandRecord]:
        """The others' live records by peer id (called with `_lock` held)."""

    @abc.abstractmethod
    def _request_poll(self) -> int:
        """Ask the thread for a fresh read of the swarm (with `_lock` held); returns how many
        polls from now will include it."""

    def _log_view(self) -> None:
        """Log the islands that joined or left this member's view since the last call: the one
        join/leave log of both back-ends, called by their threads after each read of the swarm."""
        ids = set(self.members()) - {self.peer_id}
        for pid in sorted(ids - self._seen):
            logger.info("island %s joined run %r", pid, self.config.run_id)
        for pid in sorted(self._seen - ids):
            logger.info("island %s left run %r (tombstone or expiry)", pid, self.config.run_id)
        self._seen = ids

    def _after_stop(self) -> None:
        """After the thread has stopped (or was abandoned): release what it does not own."""

    def _kick(self) -> None:
        """Wake the background thread (no-op for a thread that polls)."""

    def _announced(self, first: bool) -> None:
        """Called under the lock when a record is set; `first` on the very first one."""

    def announce(self, record: IslandRecord) -> None:
        self._check_own(record)
        if self.observer:
            raise DiscoveryError("an observer cannot announce a record")
        with self._lock:
            if self._left:
                raise DiscoveryError("announce() after leave()")
            self._announced(self._record is None)
            self._record, self._dirty = record, True
        self._kick()

    def members(self) -> dict[str, IslandRecord]:
        with self._lock:
            out = self._live_records()
            out.pop(self.peer_id, None)
            if self._record is not None and not self._left:
                out[self.peer_id] = self._record
        return out

    def leave(self) -> None:
        with self._lock:
            if self._left or self._record is None or self._thread is None or not self._thread.is_alive():
                self._left = True
                return
            self._leave_requested = True
        self._kick()
        if not self._left_event.wait(timeout=self._leave_timeout):
            logger.warning("leave: the tombstone was not sent within %.0f s", self._leave_timeout)

    def refresh(self, timeout: float = 10.0) -> dict[str, IslandRecord]:
        """Read the swarm now (waits at most `timeout`) and return `members()`."""
        with self._lock:
            target = self._polls + self._request_poll()
        self._kick()
        with self._poll_done:
            self._poll_done.wait_for(lambda: self._polls >= target or self._stop.is_set(), timeout)
        return self.members()

    def shutdown(self) -> None:
        if self._stop.is_set():
            return
        self.leave()
        self._stop.set()
        self._kick()
        if self._thread is not None:
            self._thread.join(timeout=self._join_timeout)
        if self._thread is not None and self._thread.is_alive():
            logger.warning("the %s membership thread did not stop within %.0f s; going on without it",
                           self.kind, self._join_timeout)
        self._after_stop()
