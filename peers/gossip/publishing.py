"""Publishing an island's outer state: a snapshot on the training thread, the rest on a thread of its own.

A round's end costs the training thread the outer step and one copy of what it publishes (`publish`):
the anchor, and the momentum when it travels (`core.modes.Momentum`, in its codec), into a host
buffer allocated once and reused every round (from an accelerator, an asynchronous copy into pinned
memory: the training thread queues it and goes on; the publishing thread waits for it). Encoding,
digests, the public state's update, serving it and what follows (the announce, the relay's push)
run on the island's `publish-<name>` thread, overlapped with the next round's inner steps. A
publish still running when the next round ends does not hold that round up: its snapshot goes into
a second buffer (allocated the first time it is needed) and waits; a newer one replaces a waiting
one (`coalesced`, logged once), so the newest state is served as soon as the thread is free.

The manifest's meta names the island and its model fingerprint and its run (the digest of the run's
initial weights), so a partner with another model, or from another run, refuses the state before
mixing it.

With `exchange="updates"` the island also advances its public state by one compressed update per
publish (`core.public`) and serves it to partners that ask for it (`exchange.public_views`); the
whole state stays published for joiners, catch-ups and partners that do not ask. The update is
encoded outside the public views' lock and applied under it, so that a reader of the public state
(the admission's reading of a partner's) sees it whole, at one version (`peers.gossip.public_side`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from p2p_diloco.core import codecs
from p2p_diloco.core.device import copy_async, pinned_buffer
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.modes import Exchange
from p2p_diloco.exchange.server import SnapshotServer
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.gossip.public_side import PublicSide

log = logging.getLogger(__name__)
SERVING_S = 2.0
"""A reply went out this recently: a partner's fetch is under way (a 64 kB chunk takes 1 s at 0.5 Mbit/s)."""


@dataclass
class _Job:
    """One snapshot waiting to be published, or being published."""

    slot: dict[str, torch.Tensor]
    """The host buffers it was copied into (its tensors, and any `EncodedVector` as it came)."""
    tensors: dict
    version: int
    tokens: int
    parts: int
    chain: int
    """The public state's chain when it was taken (`PublicSide.restart` starts a new one)."""
    ready: list
    """CUDA events the copies finish at."""
    then: Callable[[], None] | None


class Publisher:
    """Publishes the state of one island's `OuterLoop` on its `SnapshotServer` (see the module docstring)."""

    def __init__(self, server: SnapshotServer, outer: OuterLoop, exchange: Exchange, identity: Identity) -> None:
        self.server, self.outer, self.exchange, self.identity = server, outer, exchange, identity
        self.published_at = 0.0
        """Unix time of the last publish (the phase of the island's rounds, for pacing)."""
        self.public_side = PublicSide(server, outer, exchange, identity)
        """This island's public state (`exchange="updates"`), from its first publish on."""
        self.coalesced = 0
        """Snapshots replaced by a newer one before the publishing thread reached them."""
        self.background_s = 0.0
        """Seconds the publishing thread spent publishing (overlapped with training)."""
        self.snapshot_s = 0.0
        """Seconds the training thread spent on the last snapshot (queuing its copies)."""
        self._slots: list[dict[str, torch.Tensor]] = []
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._running: _Job | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def tensors(self) -> dict[str, torch.Tensor]:
        s = self.outer.state
        return {"phi": s.phi, "m": s.m} if self.outer.momentum.travels else {"phi": s.phi}

    def publish(self, parts: int = 1, then: Callable[[], None] | None = None, wait: bool = False) -> None:
        """Snapshot the state as it is now and have the publishing thread encode it and serve it
        from then on (the public state's update in `parts` fragments), then call `then()` there;
        `wait`: return only once it is served. An error of the last publish is raised here."""
        t0 = time.perf_counter()
        self._raise_error()
        s = self.outer.state
        with self._cond:
            waiting, self._pending = self._pending, None
            slot = waiting.slot if waiting is not None else self._free_slot()
        if waiting is not None:
            self.coalesced += 1
            if self.coalesced == 1:
                log.info("%s: the publish of version %d was still running when version %d was ready: the newer "
                         "state replaces the one waiting (coalesced; counted in the summary)", self.identity.name,
                         self._running.version if self._running else waiting.version, s.version)
        tensors, ready = {}, []
        for name, x in self.tensors().items():
            if isinstance(x, codecs.EncodedVector):
                tensors[name] = x
                continue
            buf = slot.get(name)
            if buf is None or buf.numel() != x.numel():
                buf = slot[name] = pinned_buffer(x.numel(), x.device)
            if (event := copy_async(x.reshape(-1), buf)) is not None:
                ready.append(event)
            tensors[name] = buf
        job = _Job(slot, tensors, s.version, s.tokens, parts, self.public_side.chain, ready, then)
        with self._cond:
            self._pending = job
            self._cond.notify_all()
            self._start()
        self.snapshot_s = time.perf_counter() - t0
        if wait:
            self.flush()

    def _free_slot(self) -> dict[str, torch.Tensor]:
        """(Under the lock.) A slot the publishing thread does not read: at most two exist."""
        busy = None if self._running is None else self._running.slot
        for slot in self._slots:
            if slot is not busy:
                return slot
        self._slots.append({})
        return self._slots[-1]

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"publish-{self.identity.name}", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                self._running, self._pending = self._pending, None
            job, t0 = self._running, time.perf_counter()
            try:
                self._publish_now(job)
                if job.then is not None:
                    job.then()
            except BaseException as e:  # raised on the training thread at its next publish, and logged now
                log.error("%s: publishing version %d failed: %s", self.identity.name, job.version, e)
                self._error = e
            finally:
                with self._cond:
                    self._running = None
                    self.background_s += time.perf_counter() - t0
                    self._cond.notify_all()

    def _publish_now(self, job: _Job) -> None:
        for event in job.ready:
            event.synchronize()
        momentum = self.outer.momentum
        self.server.publish(job.tensors, job.version, job.tokens, meta=self.identity.meta(),
                            codec_of={"m": momentum.codec} if momentum.travels else None)
        if self.exchange.updates:
            self.public_side.advance(job.tensors["phi"], job.parts, job.chain, job.version, job.tokens)
        self.published_at = time.time()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every snapshot taken is published (start-up, the final mix, leaving: never
        between inner steps); False if `timeout` passed first. An error of the last publish is raised."""
        with self._cond:
            done = self._cond.wait_for(lambda: self._pending is None and self._running is None, timeout)
        self._raise_error()
        return done

    def busy(self) -> bool:
        """A publish runs or waits."""
        return self._pending is not None or self._running is not None

    def close(self, timeout: float = 10.0) -> None:
        """Publish what waits, then stop the thread (safe to call twice)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    @property
    def state_bytes(self) -> int:
        """Bytes of the whole state served now (what a partner's fetch of it moves; 0 before the first publish)."""
        latest = self.server.latest()
        return 0 if latest is None else latest[0].total

    def published_last(self) -> None:
        """This island publishes nothing newer: partners waiting for its next version get this one."""
        self.server.published_last()

    def serving(self) -> bool:
        """A partner is fetching from this island: a reply went out within `SERVING_S`."""
        return self.server.sent_within(SERVING_S) > 0
