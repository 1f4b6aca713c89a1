"""An outbound-only island's pushes: its state over each connection it opens, and to the relay.

Nobody can dial an outbound-only island (`peers.gossip.reach`), so it hands its state over the
connections it opens itself: to the partner it fetches from, once the fetched state is handed over
(`push`), and to the bootstrap's relay, if it runs one, after each publish (`push_to_relay`, on a
thread of its own, skipped while the previous one is still on its way). A refusal or a failure costs
only that push.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import TransportError
from p2p_diloco.exchange.linkemu import EmulatedLink

log = logging.getLogger(__name__)


class Pusher:
    """What an outbound-only island pushes, and how it went (see the module docstring)."""

    def __init__(self, network: NetworkConfig, timeout_s: float, source: Callable[[], tuple | None] | None = None,
                 relay: str | None = None, secret: str | None = None, link: EmulatedLink | None = None) -> None:
        """`source()`: this island's latest (manifest, payload) to push (None: the island is reachable and
        pushes nothing); `relay`: the bootstrap's relay endpoint, if it runs one."""
        self.network, self.timeout_s, self.source, self.relay = network, timeout_s, source, relay
        self.secret, self.link = secret, link
        self.pushes = {"sent": 0, "failed": 0, "bytes": 0}
        self._lock = threading.Lock()
        self._relay_thread: threading.Thread | None = None

    def push_to_relay(self) -> None:
        if self.relay is None or self.source is None:
            return
        if self._relay_thread is not None and self._relay_thread.is_alive():
            return
        self._relay_thread = threading.Thread(target=self._push_relay, name="relay-push", daemon=True)
        self._relay_thread.start()

    def _push_relay(self) -> None:
        from p2p_diloco.exchange.client import Fetcher

        try:
            with Fetcher(self.relay, self.network, secret=self.secret, link=self.link) as relay:
                self.push(relay)
        except TransportError as e:
            log.info("cannot reach the relay %s: %s", self.relay, e)

    def push(self, fetcher) -> None:
        """Push our latest state over `fetcher`'s connection."""
        source = None if self.source is None else self.source()
        if source is None:
            return
        try:
            n = fetcher.push(*source, timeout=self.timeout_s)
        except TransportError as e:
            log.info("push to %s failed: %s", fetcher.endpoint, e)
            with self._lock:
                self.pushes["failed"] += 1
            return
        with self._lock:
            self.pushes["sent"] += 1
            self.pushes["bytes"] += n
