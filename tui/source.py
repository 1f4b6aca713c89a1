"""Where the dashboard's data comes from: sources that deliver `Snapshot`s of the member list.

A source is plain Python with no widget code. `start(deliver)` hands it a callback (the app posts a
message from it, so it is safe to call from any thread); `stop()` ends the delivery.

- `MembershipSource` watches a live run: a background thread opens a read-only discovery observer
  in a child process (`ObserverProcess`: the DHT back-end would load hivemind and with it torch
  into the dashboard) and reads `members()` every `interval` seconds. When no bootstrap answers,
  or a read fails, it delivers a `disconnected` snapshot naming the reason and keeps retrying; it
  never raises into the app. `stop()` gives up an observer that is still opening (a bootstrap
  that does not answer), so that leaving the dashboard never waits on it. A run whose records are
  sealed with a swarm secret the source was not given reads as `disconnected`, with the reason
  (`membership.SEALED_HINT`) as the detail.
- `ReplaySource` plays a fixed list of snapshots, all at once or one per interval: the dashboard of
  a recorded run, and what the snapshot tests render with a frozen clock.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from p2p_diloco.discovery.membership import Membership, sealed_hint
from p2p_diloco.discovery.observer import ObserverProcess
from p2p_diloco.discovery.records import IslandRecord

if TYPE_CHECKING:
    from p2p_diloco.config import DiscoveryConfig

logger = logging.getLogger(__name__)

STATUSES = ("connecting", "connected", "disconnected")


@dataclass(frozen=True)
class Snapshot:
    """What a source saw at time `t`."""

    t: float
    """Unix time of the reading (the source's clock)."""
    records: dict[str, IslandRecord] | None
    """Live records by peer id; None when nothing could be read (not connected)."""
    status: str = "connected"
    """One of `STATUSES`."""
    detail: str = ""
    """Why a source is disconnected, or where it reads from."""
    kind: str | None = None
    """Discovery back-end: `dht` or `zmq`."""


Deliver = Callable[[Snapshot], None]


class Source(abc.ABC):
    """Delivers snapshots of one run to a callback until stopped."""

    run_id: str
    expiry: float
    """Record lifetime the run's islands use (the state tells expiries from clean leaves with it)."""

    @abc.abstractmethod
    def start(self, deliver: Deliver) -> None:
        """Begin delivering; returns at once (or after delivering a fixed series)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop delivering and release what the source holds (idempotent)."""

    def describe(self) -> str:
        """Where the data comes from, for the header."""
        return type(self).__name__


class MembershipSource(Source):
    """Polls a discovery observer on a background thread (see the module docstring)."""

    def __init__(self, config: DiscoveryConfig, *, interval: float | None = None, retry: float = 2.0,
                 clock: Callable[[], float] = time.time,
                 opener: Callable[..., Membership] | None = None) -> None:
        self.config = config
        self.run_id, self.expiry = config.run_id, config.expiry
        self.interval = config.poll if interval is None else interval
        self.retry = retry
        self.clock = clock
        self._opener = opener
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.membership: Membership | None = None

    def describe(self) -> str:
        return ", ".join(self.config.bootstrap) or "no bootstrap"

    def start(self, deliver: Deliver) -> None:
        if self._thread is not None:
            raise RuntimeError("a MembershipSource can be started once")
        self._thread = threading.Thread(target=self._run, args=(deliver,), name="dashboard-source", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling; waits up to `timeout` (an observer still connecting is closed when it returns)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.info("the dashboard source is still connecting; it will close when that returns")

    def _open(self) -> Membership:
        if self._opener is not None:
            return self._opener(self.config, observer=True)
        return ObserverProcess(self.config, cancel=self._stop)

    def _run(self, deliver: Deliver) -> None:
        def send(records, status, detail="", kind=None):
            try:
                deliver(Snapshot(self.clock(), records, status, detail, kind))
            except Exception:  # a closing app must not kill the thread that closes the observer
                logger.debug("delivering a snapshot failed", exc_info=True)

        send(None, "connecting", self.describe())
        m: Membership | None = None
        try:
            while not self._stop.is_set():
                if m is None:
                    try:
                        m = self.membership = self._open()
                    except Exception as e:  # unreachable bootstrap, daemon failure: show it and retry
                        if self._stop.is_set():  # given up by `stop()`
                            break
                        logger.info("dashboard: cannot watch run %r: %s", self.run_id, e)
                        send(None, "disconnected", f"retrying every {self.retry:g}s; {_reason(e)}")
                        self._stop.wait(self.retry)
                        continue
                    if self._stop.is_set():
                        break
                try:
                    records = m.members()
                    hint = sealed_hint(m, records)
                except Exception as e:
                    logger.info("dashboard: reading the member list failed: %s", e)
                    send(None, "disconnected", f"reconnecting; {_reason(e)}")
                    self._close(m)
                    m = self.membership = None
                    self._stop.wait(self.retry)
                    continue
                if hint and not records:  # nothing this source can read: say why, like `status` does
                    send(None, "disconnected", hint, m.kind)
                else:
                    send(records, "connected", self.describe(), m.kind)
                self._stop.wait(self.interval)
        finally:
            if m is not None:
                self._close(m)

    @staticmethod
    def _close(m: Membership) -> None:
        try:
            m.shutdown()
        except Exception:
            logger.info("closing the discovery observer failed", exc_info=True)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


class ReplaySource(Source):
    """Plays fixed snapshots: all during `start()` (interval None), or one per `interval` seconds."""

    def __init__(self, frames: Sequence[Snapshot], *, interval: float | None = None, run_id: str = "replay",
                 expiry: float = 30.0) -> None:
        self.frames = list(frames)
        self.interval = interval
        self.run_id, self.expiry = run_id, expiry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_timeline(cls, timeline: Iterable[tuple[float, Iterable[IslandRecord]]], *, kind: str = "zmq",
                      detail: str = "replay", **kwargs) -> ReplaySource:
        """Frames from `(t, records)` pairs: the member list as it was at each time `t`."""
        frames = [Snapshot(t, {r.peer_id: r for r in records}, "connected", detail, kind) for t, records in timeline]
        return cls(frames, **kwargs)

    def describe(self) -> str:
        return f"replay of {len(self.frames)} snapshots"

    def start(self, deliver: Deliver) -> None:
        if self.interval is None:
            for frame in self.frames:
                deliver(frame)
            return
        self._thread = threading.Thread(target=self._play, args=(deliver,), name="dashboard-replay", daemon=True)
        self._thread.start()

    def _play(self, deliver: Deliver) -> None:
        for frame in self.frames:
            if self._stop.is_set():
                return
            deliver(frame)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
