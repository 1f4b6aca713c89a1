"""What a snapshot server sends a client that asks for an island's public state (protocol 1.1, `hello.pub`).

The island hands the server an immutable `PublicView` at each publish: its public state's chain,
version and fp32 vector, and the updates it keeps (`core.public`). A client that holds the public
state of that chain at a kept version gets the updates since then, each a tensor `u<k>` in its
wire codec (`sign` or `int4`); so does a client that names the chain `INIT` at 0 when this chain
starts at the run's initial weights; any other client gets the public state whole (`pub`, fp32, exact).
The manifest's meta says which: `pub_chain`, `pub_version` and `pub_digest` (of the public state
after them, so a receiver notices a copy that drifted) always, `pub_parts` (the fragments of the
last update) when above 1, and `pub_from` (the version the updates start from) only for updates.
An update of one fragment is named `u<k>@<start>`, its first value's place (`update_name`). Packed answers are cached per starting version until the
next publish, and kept by sid a little longer for fetches still reading them.

The island changes its public state in place (`core.public.apply_`): it does so, and hands over the
next view, under `changing()`, and the public state is packed whole under the same lock, from the
view current then; so a whole answer is never torn, nor labelled with another version.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from p2p_diloco.core.public import INIT, Update, update_name, updates_since
from p2p_diloco.exchange import payload, wire

KEEP_PACKED = 16
"""Packed answers served by sid after they stop being current (fetches still reading them), as long
as those hold no more bytes than two whole public states."""


@dataclass(frozen=True)
class PublicView:
    """An island's public state as of one publish (nothing in it changes afterwards)."""

    chain: str
    version: int
    pub: torch.Tensor
    updates: tuple[Update, ...]
    """The last updates kept, the newest last: the one to `version`, the one before, ..."""
    outer_version: int
    tokens: int
    meta: dict[str, Any]
    digest: str = ""
    """`core.params.weights_digest` of `pub`: a receiver checks its copy against it after the updates."""
    from_init: bool = False
    """The chain starts at the run's initial weights: a client naming `INIT` at 0 holds its start."""
    parts: int = 1
    """Fragments of the last update (`core.public.mixed_share`)."""

    def start(self, chain: str | None, since: int | None) -> int | None:
        """The version the answer to a client holding `(chain, since)` starts from: `since` when
        the updates from there are kept, else None (the public state whole)."""
        ours = chain == self.chain or (chain == INIT and self.from_init and since == 0)
        return since if ours and updates_since(self.updates, self.version, since) is not None else None

    def tensors(self, start: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The tensors and extra meta of the answer that starts from `start` (`start()`)."""
        meta = {"pub_chain": self.chain, "pub_version": self.version, "pub_digest": self.digest,
                **({"pub_parts": self.parts} if self.parts > 1 else {})}
        if start is None:
            return {"pub": self.pub}, meta
        updates = updates_since(self.updates, self.version, start)
        whole = self.pub.numel()
        return ({update_name(start + 1 + k, u.at, u.values.numel() != whole): u.values for k, u in enumerate(updates)},
                {**meta, "pub_from": start})


class PublicViews:
    """The current `PublicView` and its packed answers (thread-safe: set on the training thread,
    read on the server's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changing = threading.Lock()
        self._view: PublicView | None = None
        self._current: dict[int | None, payload.Published] = {}  # by the version an answer starts from
        self._by_sid: OrderedDict[int, payload.Published] = OrderedDict()

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Held while the island changes its public state in place and publishes the next view."""
        with self._changing:
            yield

    def publish(self, view: PublicView) -> None:
        with self._lock:
            self._view, self._current = view, {}

    @property
    def outer_version(self) -> int | None:
        """The outer version of the view served now (None before the first publish)."""
        view = self._view
        return None if view is None else view.outer_version

    def answer(self, hello: wire.Hello) -> payload.Published | None:
        """The packed answer to `hello` (None before the first publish)."""
        view, start, packed = self._lookup(hello)
        if view is None or packed is not None:
            return packed
        if start is not None:  # updates: immutable
            return self._pack(view, start)
        with self._changing:  # the public state whole, as of the view current now
            view, start, packed = self._lookup(hello)
            return packed or self._pack(view, start)

    def _lookup(self, hello: wire.Hello) -> tuple[PublicView | None, int | None, payload.Published | None]:
        """The view served now, where its answer to `hello` starts, and that answer if it is packed."""
        with self._lock:
            view = self._view
            if view is None:
                return None, None, None
            start = view.start(hello.chain, hello.since)
            return view, start, self._current.get(start)

    def _pack(self, view: PublicView, start: int | None) -> payload.Published:
        tensors, extra = view.tensors(start)
        manifest, buf = payload.pack(tensors, "fp32", version=view.outer_version, tokens=view.tokens,
                                     meta={**view.meta, **extra})
        packed = payload.Published.of(manifest, buf)
        with self._lock:
            if self._view is view:
                self._current[start] = packed
            self._by_sid[manifest.sid] = packed
            self._forget_old(8 * view.pub.numel())
        return packed

    def _forget_old(self, budget: int) -> None:
        """Drop the oldest answers no longer current while more than `KEEP_PACKED` or `budget` bytes are kept."""
        current = {p.manifest.sid for p in self._current.values()}
        old = [sid for sid in self._by_sid if sid not in current]
        held = sum(p.manifest.total for sid, p in self._by_sid.items() if sid not in current)
        while old and (len(old) > KEEP_PACKED or held > budget):
            sid = old.pop(0)
            held -= self._by_sid.pop(sid).manifest.total

    def by_sid(self, sid: int) -> payload.Published | None:
        with self._lock:
            return self._by_sid.get(sid)
