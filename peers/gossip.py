"""The background gossip worker: fetches a partner's snapshot while the island trains.

Like hivemind's DHT, a synchronous facade over a background thread: the training loop calls
`start(record)` at the start of a round and `take()` between inner steps or at the round's end,
and never waits on the network. A fetch that has not finished by the end of the round keeps
going and is taken in a later round (the staleness weight then counts it less); a fetch that
fails costs only that exchange.
Nothing partial is ever handed over: the transport returns a whole, checked snapshot or raises.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import TransportError
from p2p_diloco.membership import IslandRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchResult:
    peer_id: str
    snapshot: object | None  # p2p_diloco.fetcher.Snapshot when ok
    error: str | None
    seconds: float
    nbytes: int


class GossipWorker:
    def __init__(self, network: NetworkConfig, timeout_s: float) -> None:
        self.network, self.timeout_s = network, timeout_s
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._result: FetchResult | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, partner: IslandRecord) -> bool:
        """Begin fetching `partner`'s snapshot in the background; False if a fetch is still running."""
        if self.busy or self._closed:
            return False
        self._thread = threading.Thread(target=self._fetch, args=(partner,), name=f"gossip-{partner.peer_id[:8]}",
                                        daemon=True)
        self._thread.start()
        return True

    def _fetch(self, partner: IslandRecord) -> None:
        from p2p_diloco.fetcher import fetch

        started = time.monotonic()
        try:
            snap = fetch(partner.endpoint, self.network, timeout=self.timeout_s)
            result = FetchResult(partner.peer_id, snap, None, time.monotonic() - started, snap.nbytes)
        except TransportError as e:
            log.info("exchange with %s at %s failed: %s", partner.peer_id[:8], partner.endpoint, e)
            result = FetchResult(partner.peer_id, None, f"{type(e).__name__}: {e}", time.monotonic() - started, 0)
        except Exception as e:  # a bug must not kill the island; it costs this exchange and is logged loudly
            log.exception("fetch from %s crashed", partner.peer_id[:8])
            result = FetchResult(partner.peer_id, None, f"{type(e).__name__}: {e}", time.monotonic() - started, 0)
        with self._lock:
            self._result = result

    def take(self) -> FetchResult | None:
        """The finished fetch, if any (each result is handed out once)."""
        with self._lock:
            result, self._result = self._result, None
        return result

    def close(self, timeout: float = 2.0) -> None:
        """Stop taking new work; wait briefly for a running fetch, which is then abandoned."""
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout)
