"""The background gossip worker: fetches a partner's snapshot while the island trains.

Like hivemind's DHT, a synchronous facade over a background thread: the training loop calls
`start(record)` at the start of a round (optionally asking the worker to wait until the partner
publishes a given version) and `take()` between inner steps or at the round's end, and never
waits on the network. A fetch that has not finished by the end of the round keeps
going and is taken in a later round (the staleness weight then counts it less); a fetch that
fails costs only that exchange.
Nothing partial is ever handed over: the transport returns a whole, checked snapshot or raises.

With `exchange="updates"` the worker asks partners for their public states (`core.public`): the
updates since the copy it holds, which it applies to that copy, or the public state whole. A partner
that answers with its whole state (it sends whole states) is mixed as always.

An outbound-only island (`peers.gossip.reach`) also pushes its own state over each connection it opens to
a reachable partner, once the fetched state is handed over; a partner that is outbound-only itself
is reached through the bootstrap's relay, when there is one, to which every outbound-only island
pushes each state it publishes (`push_to_relay`, on a thread of its own).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2p_diloco.config import NetworkConfig
from p2p_diloco.core.codecs import EncodedVector
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.params import weights_digest
from p2p_diloco.choices import MAX_FRAGMENTS as MAX_PARTS
from p2p_diloco.core.public import PublicCopies, PublicCopy, Update, mixed_share, parse_update_names
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import BadPayload, CodecError, FetchCancelled, ForeignState, TransportError
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.peers.gossip.measure import Measured
from p2p_diloco.peers.gossip.pushing import Pusher
from p2p_diloco.peers.identity import Identity

if TYPE_CHECKING:
    from p2p_diloco.exchange.client import Fetcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchResult:
    peer_id: str
    snapshot: object | None  # p2p_diloco.exchange.client.Snapshot when ok
    error: str | None
    seconds: float
    """How long the transfer took (or the attempt, when it failed)."""
    nbytes: int
    waited_s: float = 0.0
    """How long the worker waited for the partner to publish the version asked for, before the transfer."""
    measured: Measured | None = None
    """What `measure` said of the state (`peers.admission.plausibility`), computed on the worker's thread."""
    bad_state: bool = False
    """The failure was the partner's state itself (digests, sizes, non-finite values), not the link."""
    pushed: bool = False
    """The partner pushed this state to us (`peers.gossip.reach.PushInbox`) rather than us fetching it."""
    public: PublicCopy | None = None
    """The partner's public state, brought up to date by this fetch (`exchange="updates"`)."""
    rate_bps: float = 0.0
    """The link's rate the transfer showed, bytes per second, measured between its chunks (`core.linkfit`)."""
    cancelled: bool = False
    """The island gave the fetch up itself (`GossipWorker.cancel`): neither the link's fault nor the partner's."""


def route(partner: IslandRecord, relay: str | None) -> tuple[str | None, str | None]:
    """Where `partner`'s state is fetched: its endpoint, or, for an outbound-only member nobody can
    dial, the relay (None: there is none), naming the peer (the second item: None for a direct fetch)."""
    return (relay, partner.peer_id) if partner.reach == "outbound" else (partner.endpoint, None)


class GossipWorker:
    def __init__(self, network: NetworkConfig, timeout_s: float, measure=None, push_source=None,
                 relay: str | None = None, copies: PublicCopies | None = None, measure_public=None,
                 secret: str | None = None, link: EmulatedLink | None = None) -> None:
        """`push_source()`: this island's latest (manifest, payload) to push, for an outbound-only
        island (else None); `relay`: the bootstrap's relay endpoint, if it runs one; `copies`: the
        partners' public states held (`exchange="updates"`), and `measure_public(copy)` measures one
        (`peers.gossip.measure.measure`)."""
        self.network, self.secret, self.timeout_s, self.measure = network, secret, timeout_s, measure
        self.link = link
        """A WAN link to emulate for what this island's fetches send (benchmarks and tests)."""
        self.copies, self.measure_public = copies, measure_public
        self.relay = relay
        self.pusher = Pusher(network, timeout_s, push_source, relay, secret, link)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._result: FetchResult | None = None
        self._finished = threading.Event()
        """Set while a finished fetch waits to be taken (`wait_result`)."""
        self._running: tuple[float, Fetcher] | None = None
        """The running fetch's start (monotonic) and its `Fetcher`, for `progress()`."""
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def has_result(self) -> bool:
        """A finished fetch waits to be taken (a new one would lose it, so `start` refuses)."""
        with self._lock:
            return self._result is not None

    def start(self, partner: IslandRecord, min_version: int = 0, wait_until: float = 0.0, updates: bool = True,
              rate_bps: float = 0.0) -> bool:
        """Begin fetching `partner`'s snapshot in the background; False if a fetch is still running or
        its result has not been taken. `updates=False`: its whole state, though this island holds
        public states (`--exchange auto` on a fast link).

        With `min_version`, the partner holds its answer until it has published that version or
        `time.monotonic()` passes `wait_until`, then sends whatever it has (`hello.want`,
        `exchange.parked`): the answer leaves the moment the version exists, where discovery would
        learn of it a second or two later, and waiting costs no request but the fetch's own.
        `rate_bps`: the slowest partner rate the island measured, for a link this fetch has not
        measured (the silence a fetch allows, `exchange.flowcontrol.WindowController.silence_s`).
        """
        if self.busy or self._closed or self.has_result:
            return False
        self._thread = threading.Thread(target=self._fetch, args=(partner, min_version, wait_until, updates, rate_bps),
                                        name=f"gossip-{partner.peer_id[:8]}", daemon=True)
        self._thread.start()
        return True

    def _fetch(self, partner: IslandRecord, min_version: int, wait_until: float, updates: bool, rate_bps: float) -> None:
        from p2p_diloco.exchange.client import Fetcher

        started = time.monotonic()
        endpoint, via = route(partner, self.relay)
        via_relay = via is not None
        handed = False
        try:
            with Fetcher(endpoint, self.network, secret=self.secret, link=self.link, peer=via) as fetcher:
                self._running = (started, fetcher)
                public = self.copies is not None and updates and not via_relay
                wait = partner.version < min_version and wait_until > started  # the server holds its answer
                snap = fetcher.fetch(self.timeout_s, decode=False,  # decoded slice by slice as it is mixed
                                     pub=public, held=self.copies.asking(partner.peer_id) if public else None,
                                     want=min_version if wait else None, wait_s=wait_until - started, rate_hint=rate_bps)
                copy = self._hold_public(partner.peer_id, snap) if public else None
                measured = self.measured(snap) if copy is None else self._measured_public(copy)
                self._running = None
                with self._lock:  # handed over at once: mixing need not wait for our push
                    self._result = FetchResult(partner.peer_id, snap, None, snap.seconds, snap.wire_bytes,
                                               waited_s=time.monotonic() - started - snap.seconds,
                                               measured=measured, public=copy, rate_bps=_rate(snap.stats))
                    self._finished.set()
                handed = True
                if not via_relay:
                    self.pusher.push(fetcher)
            return
        except TransportError as e:
            self._running = None
            log.info("exchange with %s at %s failed: %s", partner.label, partner.endpoint, e)
            result = FetchResult(partner.peer_id, None, f"{type(e).__name__}: {e}", time.monotonic() - started, 0,
                                 bad_state=isinstance(e, BadPayload), cancelled=isinstance(e, FetchCancelled))
        except Exception as e:  # a bug must not kill the island; it costs this exchange and is logged loudly
            self._running = None
            log.exception("fetch from %s crashed", partner.label)
            if handed:
                return
            result = FetchResult(partner.peer_id, None, f"{type(e).__name__}: {e}", time.monotonic() - started, 0)
        with self._lock:
            self._result = result
            self._finished.set()

    def cancel(self) -> bool:
        """Give up the running fetch (it ends with a `cancelled` result at its next chunk); False if none runs."""
        running = self._running
        if running is None:
            return False
        running[1].cancel()
        return True

    def progress(self) -> tuple[float, int, float, float] | None:
        """The running fetch's seconds so far, the bytes it received, the seconds since its first chunk
        and its data rate since (NaN before a second chunk); None when none runs."""
        running = self._running
        if running is None:
            return None
        return (time.monotonic() - running[0], running[1].wire_bytes, *running[1].data_progress())

    def push_to_relay(self) -> None:
        """An outbound-only island with a relay: deliver the state just published there (`Pusher`)."""
        if not self._closed:
            self.pusher.push_to_relay()

    @property
    def pushes(self) -> dict[str, int]:
        """This island's pushes: sent, failed, and their bytes."""
        return self.pusher.pushes

    def _hold_public(self, peer: str, snap) -> PublicCopy | None:
        """Bring the copy of `peer`'s public state up to what `snap` answered (None: it answered with
        its whole state). Raises `BadPayload` for an answer that does not fit the copy asked from."""
        meta, tensors = snap.meta, snap.tensors
        if "pub_chain" not in meta:
            return None
        chain, version, start = meta.get("pub_chain"), meta.get("pub_version"), meta.get("pub_from")
        try:
            if not isinstance(chain, str) or not isinstance(version, int) or not isinstance(start, (int, type(None))):
                raise CodecError(f"pub_chain/pub_version/pub_from of types {type(chain).__name__}, "
                                 f"{type(version).__name__}, {type(start).__name__}")
            if start is None:
                if set(tensors) != {"pub"}:
                    raise CodecError(f"a whole public state is one tensor 'pub', got {sorted(tensors)[:4]}")
                copy = self.copies.replace(peer, chain, version, tensors["pub"].float())
            else:
                if len(tensors) != version - start:
                    raise CodecError(f"updates {start + 1}..{version} expected, got {list(tensors)[:4]}")
                at = parse_update_names(list(tensors), start)
                copy = self.copies.advance(peer, chain, start, [Update(u, a) for u, a in zip(tensors.values(), at)])
            parts = meta.get("pub_parts", 1)
            if type(parts) is not int or not 1 <= parts <= MAX_PARTS:
                raise CodecError(f"pub_parts must be an integer in 1..{MAX_PARTS}, got {str(parts)[:20]}")
            copy.parts = parts
            if weights_digest(copy.pub) != meta.get("pub_digest"):
                raise CodecError("the copy does not match the sender's public state (pub_digest)")
            return copy
        except CodecError as e:
            self.copies.forget(peer)
            raise BadPayload(f"public state from {snap.endpoint}: {e}") from e

    def _measured_public(self, copy: PublicCopy) -> Measured | None:
        try:
            return None if self.measure_public is None else self.measure_public(copy)
        except Exception as e:  # another shape: refused with a reason when it is taken
            log.debug("could not measure a public state: %s", e)
            return None

    def measured(self, snap) -> Measured | None:
        """`measure(snap)`, or None when there is none or the state does not fit (refused later, with a reason)."""
        if self.measure is None:
            return None
        try:
            return self.measure(snap)
        except Exception as e:  # a state of another shape: the island's own checks say so when it is taken
            log.debug("could not measure the state from %s: %s", snap.endpoint, e)
            return None

    def wait_result(self, timeout: float) -> bool:
        """Wait until a finished fetch waits to be taken, at most `timeout` seconds; True if one does."""
        return self._finished.wait(max(0.0, timeout))

    def take(self) -> FetchResult | None:
        """The finished fetch, if any (each result is handed out once)."""
        with self._lock:
            result, self._result = self._result, None
            self._finished.clear()
        return result

    def close(self, timeout: float = 2.0) -> None:
        """Stop taking new work; wait briefly for a running fetch, which is then abandoned."""
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout)


def _rate(stats) -> float:
    """A fetch's rate between its chunks, else (one chunk) its bytes over its time less a round trip."""
    for rate in (stats.data_bytes_per_s, stats.transfer_bytes_per_s):
        if math.isfinite(rate) and rate > 0:
            return rate
    return 0.0


def partner_state(snap, expected_numel: int, model: str = "", run: str = "", public: PublicCopy | None = None,
                  own_public=None, anchor=None) -> PartnerState:
    """Turn a fetched snapshot into a mixable state, refusing one for a different model or run.

    The manifest's `model` fingerprint and `run` digest (of the run's initial weights) must match
    this island's (when both are known) and every tensor must hold `expected_numel` values: a
    partner running another model, or another run of it, is refused here, with a `TransportError`
    that says why, instead of being mixed or failing inside the mixing step.

    With the partner's `public` state (`exchange="updates"`), what is mixed is this island's
    `anchor` moved by the difference of the two public states (`own_public`, `core.public`), so
    that mixing with weight a moves it by a (pub_partner - pub_own) (by `mixed_share` of that where
    updates come in fragments); the momentum stays local.
    """
    t, meta = snap.tensors, snap.meta
    if (foreign := Identity("", "", model, run).foreign(meta)) is not None:
        raise ForeignState(f"snapshot from {snap.endpoint} is for {foreign[1]}", foreign[0])
    if public is not None:
        if public.pub.numel() != expected_numel or own_public is None:
            raise TransportError(f"the public state of {snap.endpoint} does not fit this model ({public.pub.numel()} "
                                 f"values, expected {expected_numel})")
        share = mixed_share(public.parts, own_public.parts)
        phi = anchor + ((public.pub - own_public.pub) * share).to(anchor.device)
        return PartnerState(phi=phi, m=None, version=snap.version, tokens=snap.tokens,
                            peer=str(meta.get("peer_id", "")))
    if "phi" not in t:
        raise TransportError(f"snapshot from {snap.endpoint} holds no anchor 'phi'")
    for name in ("phi", "m"):
        if name in t and t[name].numel() != expected_numel:
            raise TransportError(f"snapshot from {snap.endpoint} does not fit this model ({name!r} holds "
                                 f"{t[name].numel()} values, expected {expected_numel})")
    flat = {k: v if isinstance(v, EncodedVector) else v.reshape(-1) for k, v in t.items()}
    return PartnerState(phi=flat["phi"], m=flat.get("m"), version=snap.version,
                        tokens=snap.tokens, peer=str(meta.get("peer_id", "")))
