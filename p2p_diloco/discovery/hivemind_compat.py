"""The one door to hivemind's internals: each private or undocumented attribute p2p-diloco uses.

hivemind's public `DHT` has no call to dial a peer at a known address (a bootstrap node that
restarted must be re-dialled, or islands would never find it again), none to ping one, and none to
list the peers in the routing table (the bootstrap node's join/leave log). Those reach into
`DHTNode.protocol`, `P2P._client` and `RoutingTable.uid_to_peer_id`, which a hivemind release may
rename without notice. Every such access lives here, one small function each, so that:

- `check()` verifies, once per process before a DHT starts, that the installed hivemind still has
  them, by inspecting its classes (no daemon is started), and raises `HivemindIncompatible` naming
  what is missing (tests/unit/test_hivemind_compat.py fails on such an upgrade too);
- a call that still fails at run time because the attribute is gone logs a WARNING, once per
  function and process, instead of vanishing into a debug line: a silent failure here would turn
  bootstrap reconnects off without anyone noticing.

`dht.py`, `dhtnode.py` and `bootstrap/node.py` use hivemind's public API plus these functions, nothing else.
The functions that take `node` run inside the DHT process (through `DHT.run_coroutine`).
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any, Iterable

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID, RoutingTable
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.p2pclient import Client
from hivemind.utils.multiaddr import Multiaddr

from p2p_diloco.errors import DiscoveryError

logger = logging.getLogger(__name__)


class HivemindIncompatible(DiscoveryError):
    """The installed hivemind lacks an internal attribute that discovery relies on."""


_warned: set[str] = set()


def _api_changed(what: str, e: BaseException) -> None:
    """Log, once per process and function, that a hivemind internal failed: the API has changed."""
    if what not in _warned:
        _warned.add(what)
        logger.warning("hivemind's %s failed (%s: %s): the installed hivemind no longer has the internal API "
                       "p2p-diloco uses; install the version in constraints.txt", what, type(e).__name__, e)


async def ping(node: DHTNode, peer_id: PeerID) -> bool:
    """Whether `peer_id` answers a DHT ping (`DHTNode.protocol.call_ping`); a successful ping also
    puts the peer, and us in its table, back in the routing tables."""
    try:
        call = node.protocol.call_ping
    except AttributeError as e:
        _api_changed("DHTNode.protocol.call_ping", e)
        return False
    return await call(peer_id) is not None


async def dial(node: DHTNode, peer_id: PeerID, maddrs: Iterable[Multiaddr]) -> bool:
    """Open a libp2p connection to `peer_id` at `maddrs` (`P2P._client.connect`: the public `P2P`
    has no connect); False when the peer cannot be reached, debug-logged, or the API is gone."""
    try:
        connect = node.protocol.p2p._client.connect
    except AttributeError as e:
        _api_changed("P2P._client.connect", e)
        return False
    try:
        await connect(peer_id, list(maddrs))
    except (AttributeError, TypeError) as e:  # a changed signature, not an unreachable peer
        _api_changed("P2P._client.connect", e)
        return False
    except Exception as e:  # the daemon's errors for an unreachable address are of several types
        logger.debug("dialling %s failed: %s", peer_id, e)
        return False
    return True


def routing_table_peers(node: DHTNode) -> list[PeerID]:
    """The peers in a DHT node's routing table (`DHTProtocol.routing_table.uid_to_peer_id`)."""
    try:
        return list(node.protocol.routing_table.uid_to_peer_id.values())
    except AttributeError as e:
        _api_changed("RoutingTable.uid_to_peer_id", e)
        raise HivemindIncompatible(f"hivemind's routing table has changed: {e}") from e


def reserved_subkeys() -> tuple[bytes, ...]:
    """The serialized subkeys hivemind reserves for plain (non-dictionary) values."""
    return tuple(DHTProtocol.RESERVED_SUBKEYS)


def serializer() -> Any:
    """The serializer hivemind's DHT uses for keys and values on the wire (msgpack)."""
    return DHTProtocol.serializer


def owner_key_pattern() -> str:
    """The regex of an owner key inside a subkey (`RSASignatureValidator.PUBLIC_KEY_REGEX`)."""
    return RSASignatureValidator.PUBLIC_KEY_REGEX


def _missing() -> list[str]:
    """The internal attributes this module uses that the installed hivemind lacks."""
    missing = []
    if "protocol" not in getattr(DHTNode, "__annotations__", {}):
        missing.append("hivemind.dht.node.DHTNode.protocol")
    proto = getattr(DHTProtocol, "__annotations__", {})
    missing += [f"hivemind.dht.protocol.DHTProtocol.{name}" for name in ("p2p", "routing_table") if name not in proto]
    for cls, name in ((DHTProtocol, "call_ping"), (Client, "connect")):
        if not callable(getattr(cls, name, None)):
            missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    for cls, name in ((DHTProtocol, "RESERVED_SUBKEYS"), (DHTProtocol, "serializer"),
                      (RSASignatureValidator, "PUBLIC_KEY_REGEX")):
        if not hasattr(cls, name):
            missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    # instance attributes: run the constructors, which start nothing (P2P's on a bare namespace, so
    # that no half-made P2P object runs its __del__)
    bare = types.SimpleNamespace()
    try:
        P2P.__init__(bare)
    except Exception as e:  # noqa: BLE001 - any failure means the constructor is not what we know
        missing.append(f"hivemind.p2p.P2P.__init__ ({type(e).__name__}: {e})")
    if not hasattr(bare, "_client"):
        missing.append("hivemind.p2p.P2P._client")
    try:
        table = RoutingTable(DHTID.generate(), bucket_size=1, depth_modulo=1)
    except Exception as e:  # noqa: BLE001
        missing.append(f"hivemind.dht.routing.RoutingTable.__init__ ({type(e).__name__}: {e})")
    else:
        if not isinstance(getattr(table, "uid_to_peer_id", None), dict):
            missing.append("hivemind.dht.routing.RoutingTable.uid_to_peer_id")
    return missing


@functools.lru_cache(maxsize=1)
def check() -> None:
    """Raise `HivemindIncompatible` naming every internal attribute the installed hivemind lacks
    (checked once per process; a DHT back-end calls it before it starts)."""
    missing = _missing()
    if missing:
        import hivemind

        raise HivemindIncompatible(
            f"hivemind {hivemind.__version__} lacks {', '.join(missing)}, which p2p-diloco's DHT discovery uses; "
            "install the version in constraints.txt, or use --discovery zmq")
