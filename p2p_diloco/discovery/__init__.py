"""How islands find each other: records, the membership interface, and the factory of back-ends.

Two back-ends keep one run's member list: the hivemind DHT (`dht`, the default) and, where the
libp2p daemon cannot run, a ZeroMQ rendezvous with peer exchange (`rendezvous`, `peer_exchange`).
Both implement `membership.Membership` and carry `records.IslandRecord`, sealed with the swarm
secret when there is one (`sealing`); `observer` watches a run from a child process, so a reader
that must stay light (the dashboard) never loads hivemind.

This module is the factory: it picks a back-end for a `DiscoveryConfig` and imports it only then,
so importing anything under `p2p_diloco.discovery` costs no hivemind, torch or zmq. The back-ends
import the interface (`membership`, `records`), never this factory.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Callable

from p2p_diloco.addresses import dht_multiaddrs
from p2p_diloco.errors import DiscoveryError

if TYPE_CHECKING:
    from p2p_diloco.config import DiscoveryConfig
    from p2p_diloco.discovery.membership import Membership
    from p2p_diloco.discovery.patience import Patiently

logger = logging.getLogger(__name__)


def choose_backend(config: DiscoveryConfig) -> str:
    """`dht` or `zmq` for this config (with `auto`, `dht` means: try it, fall back if libp2p fails)."""
    has_multiaddr = bool(dht_multiaddrs(config.bootstrap))
    if config.discovery == "zmq":
        return "zmq"
    if config.discovery == "dht":
        if config.bootstrap and not has_multiaddr:
            raise DiscoveryError(
                "--discovery dht needs a DHT multiaddr (/ip4/HOST/tcp/PORT/p2p/PEER_ID); "
                "tcp:// addresses are ZeroMQ rendezvous addresses (use --discovery zmq or auto)"
            )
        return "dht"
    return "dht" if has_multiaddr or not config.bootstrap else "zmq"


def open_membership(config: DiscoveryConfig, *, observer: bool = False, budget_s: float | None = None,
                    stopped: Callable[[], bool] = lambda: False) -> Membership:
    """Join (or, with `observer=True`, only watch) the run described by `config`.

    `config.discovery` picks the back-end: `dht`, `zmq`, or `auto` (the DHT when a multiaddr is
    given and the libp2p daemon starts, otherwise the ZeroMQ fallback, with a warning naming the
    reason). An observer raises `BootstrapUnanswered` when no bootstrap address answers within
    `config.connect_timeout` seconds; an island keeps trying (`patience.keep_trying`) for
    `config.join_timeout` seconds, else `budget_s` (its own time budget), else until one answers
    or `stopped()`: over the DHT through the one node it starts, which it keeps for its whole life
    (a try counts from when the node is up); over ZeroMQ, where a try costs a socket, afresh.
    """
    if observer or not config.bootstrap:
        return _open(config, observer, None)
    from p2p_diloco.discovery.patience import keep_trying

    limit = config.join_timeout if config.join_timeout is not None else budget_s
    return _open(config, False, lambda attempt: keep_trying(attempt, limit_s=limit, stopped=stopped))


def _open(config: DiscoveryConfig, observer: bool, patiently: Patiently | None) -> Membership:
    """The membership of the back-end `config` picks (see `open_membership`); `patiently` repeats
    the tries of an island's bootstrap nodes."""
    if choose_backend(config) == "dht":
        from p2p_diloco.discovery import dht, dhtnode

        try:
            return dht.DhtMembership(config, observer=observer, patiently=patiently)
        except dhtnode.DaemonUnavailable as e:
            if config.discovery != "auto":
                raise DiscoveryError(f"the libp2p daemon could not start: {e}") from e
            logger.warning("the libp2p daemon could not start (%s); using the ZeroMQ fallback for discovery", e)
    from p2p_diloco.discovery import peer_exchange
    from p2p_diloco.discovery.patience import try_timeout

    if patiently is None:
        return peer_exchange.ZmqMembership(config, observer=observer)

    def attempt(time_left: float | None) -> Membership:
        timeout = try_timeout(config.connect_timeout, time_left)
        return peer_exchange.ZmqMembership(dataclasses.replace(config, connect_timeout=timeout))

    return patiently(attempt)
