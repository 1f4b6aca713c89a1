"""The bootstrap node: a long-lived, well-known entry point to the swarm, never a coordinator.

It runs two listeners, both optional to the islands:

- a hivemind DHT node with a persistent libp2p identity (`--identity FILE`, created on first
  start), so its multiaddr `/ip4/H/tcp/P/p2p/ID` stays the same across restarts;
- the ZeroMQ rendezvous of the discovery fallback at `tcp://H:P+1` (or `--rendezvous-port`),
  which also dials an island back when asked, so an island learns whether others can reach it;
- optionally (`--relay`) a state relay at `tcp://H:P+2` (or `--relay-port`): islands that nobody can
  dial (behind NAT) push their latest state there and fetch each other's from it, so a swarm of
  NATed islands plus one public bootstrap node still trains. Off by default, with its own upload
  cap; in a run with a swarm secret the relay needs the secret (it speaks the exchange's CurveZMQ).

Without a relay it stores no training state; it never makes decisions, and islands keep meeting
each other without it.
It logs the DHT peers and rendezvous islands it sees come and go. It needs no swarm secret: it
stores and serves a sealed run's records without being able to read them (docs/SECURITY.md).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from p2p_diloco import addresses
from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import ConfigError, DiscoveryError

logger = logging.getLogger(__name__)

WATCH_INTERVAL = 2.0
"""Seconds between looks at the DHT routing table (for the join/leave log)."""
RELAY_PORT_OFFSET = 2
"""The relay listens on the DHT port + this, unless `relay_port` says otherwise."""


class BootstrapNode:
    """A DHT node with a fixed identity plus the ZeroMQ rendezvous; `start()`, `run_until(event)`, `shutdown()`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, identity: str | Path, rendezvous_port: int | None = None,
                 discovery: str = "auto", announce_host: str | None = None, start_timeout: float = 30.0,
                 relay: NetworkConfig | None = None, relay_port: int | None = None,
                 relay_secret: str | None = None) -> None:
        """`relay`: run a state relay with these exchange settings (upload cap), on `relay_port`
        (default: the DHT port + 2, or any free port), keyed by the run's `relay_secret` if it has one."""
        if discovery not in ("auto", "dht", "zmq"):
            raise ConfigError(f"discovery must be auto, dht or zmq, got {discovery!r}")
        if not 0 <= port <= 65535 - addresses.RENDEZVOUS_PORT_OFFSET:
            raise ConfigError(f"port must be in [0, {65535 - addresses.RENDEZVOUS_PORT_OFFSET}], got {port}")
        if relay is not None and discovery == "dht":
            raise ConfigError("--relay needs the rendezvous (islands learn of the relay from its dial-back answers): "
                              "use --discovery auto or zmq")
        self.identity = Path(identity)
        if not self.identity.parent.is_dir():
            raise ConfigError(f"the directory of the identity file {self.identity} does not exist")
        self.host, self.port, self.discovery = host, port, discovery
        self.rendezvous_port, self.announce_host, self.start_timeout = rendezvous_port, announce_host, start_timeout
        self.relay_config, self.relay_port, self.relay_secret = relay, relay_port, relay_secret
        self.relay = None
        self.dht = None
        self.rendezvous = None
        self.peer_id: str | None = None
        self.multiaddrs: list[str] = []

    @property
    def addresses(self) -> list[str]:
        """What islands pass to `--bootstrap`: the DHT multiaddr(s), then the rendezvous address."""
        return [*self.multiaddrs, *([self._rendezvous_address()] if self.rendezvous else [])]

    def _rendezvous_address(self) -> str:
        host = self.announce_host or self.host
        return f"tcp://{f'[{host}]' if ':' in host else host}:{self.rendezvous.port}"

    def start(self) -> list[str]:
        """Start the DHT node and the rendezvous; returns `addresses`. Whatever fails or interrupts
        it half-way, what had started is stopped again before the exception leaves."""
        try:
            return self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> list[str]:
        from p2p_diloco.discovery.peerid import peer_id_from_identity
        from p2p_diloco.discovery.rendezvous import RendezvousServer

        fresh = not self.identity.exists()
        dht_port = self.port
        if self.discovery in ("auto", "dht"):  # (hivemind, and torch with it, only for a DHT node)
            from p2p_diloco.discovery import dht, dhtnode, hivemind_compat

            hivemind_compat.check()
            try:
                self.dht = dhtnode.start_dht(
                    initial_peers=[], host=self.host, port=self.port, timeout=self.start_timeout,
                    announce_host=self.announce_host, identity_path=str(self.identity),
                    validators=[dht.RSASignatureValidator()],  # signatures only: runs are not known here
                )
            except dhtnode.DaemonUnavailable as e:
                if self.discovery == "dht":
                    raise DiscoveryError(f"the libp2p daemon could not start: {e}") from e
                logger.warning("the libp2p daemon could not start (%s); serving the ZeroMQ rendezvous only", e)
            else:
                self.peer_id = str(self.dht.peer_id)
                self.multiaddrs = [str(m) for m in self.dht.get_visible_maddrs()]
                dht_port = addresses.parse(self.multiaddrs[0]).port
        if self.peer_id is None:
            self.peer_id = peer_id_from_identity(str(self.identity))
        if fresh and self.identity.exists():
            os.chmod(self.identity, 0o600)  # it is a private key
            logger.info("created the identity file %s", self.identity)
        relay = self._start_relay(dht_port) if self.relay_config is not None else None
        if self.discovery in ("auto", "zmq"):
            explicit = self.rendezvous_port is not None
            port = self.rendezvous_port if explicit else (dht_port + addresses.RENDEZVOUS_PORT_OFFSET if dht_port else 0)
            try:
                self.rendezvous = RendezvousServer(self.host, port, self.peer_id, relay=relay)
            except DiscoveryError:
                if explicit or port == 0:
                    self.shutdown()
                    raise
                logger.warning("port %d (DHT port + %d) is taken; the rendezvous takes a random port, so pass its "
                               "tcp:// address to islands explicitly", port, addresses.RENDEZVOUS_PORT_OFFSET)
                self.rendezvous = RendezvousServer(self.host, 0, self.peer_id, relay=relay)
            self.rendezvous.start()
        logger.info("bootstrap node %s ready: %s", self.peer_id, " ".join(self.addresses))
        return self.addresses

    def _start_relay(self, dht_port: int) -> str:
        """The state relay (`exchange.server.SnapshotServer(relay=True)`); returns its endpoint."""
        from p2p_diloco.exchange.server import SnapshotServer

        port = self.relay_port if self.relay_port is not None else (dht_port + RELAY_PORT_OFFSET if dht_port else 0)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            self.relay = SnapshotServer(f"tcp://{host}:{port}", self.relay_config, secret=self.relay_secret,
                                        announce_host=self.announce_host, relay=True)
        except Exception as e:  # TransportError: the port is taken
            raise DiscoveryError(f"the relay cannot listen on port {port}: {e}") from e
        logger.info("relaying states at %s (upload cap %s Mbit/s)", self.relay.endpoint,
                    self.relay_config.max_upload_mbps or "none")
        return self.relay.endpoint

    def run_until(self, stop: threading.Event) -> None:
        """Log peers coming and going until `stop` is set."""
        from p2p_diloco.discovery import dhtnode, hivemind_compat

        known: set[str] = set()
        watching = True
        while not stop.wait(WATCH_INTERVAL):
            if self.dht is None or not watching:
                continue
            try:
                now = set(dhtnode.routing_peers(self.dht))
            except hivemind_compat.HivemindIncompatible as e:  # the DHT serves on; only the log of peers stops
                logger.warning("no longer logging DHT peers: %s", e)
                watching = False
                continue
            except Exception as e:  # the DHT process died: say so once and keep the rendezvous up
                logger.error("the DHT node stopped answering (%s: %s); the rendezvous keeps serving", type(e).__name__, e)
                self.dht = None
                continue
            for pid in sorted(now - known):
                logger.info("DHT peer %s joined (%d known)", pid, len(now))
            for pid in sorted(known - now):
                logger.info("DHT peer %s is gone (%d known)", pid, len(now))
            known = now

    def shutdown(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.rendezvous is not None:
            self.rendezvous.close()
            self.rendezvous = None
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
        logger.info("bootstrap node stopped")
