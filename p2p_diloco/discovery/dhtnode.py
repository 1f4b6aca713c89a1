"""A hivemind DHT node of this project: starting one, joining the DHT through it, keeping its
bootstrap nodes dialled, and the peers in its routing table.

An island's node (`dht.DhtMembership`) and the bootstrap node's (`bootstrap.node`) are started by
`start_dht`. An island starts its node alone and joins through it (`try_bootstrap`, repeated by
`patience.keep_trying`): one daemon and one identity for its life, however many tries it takes.
`reconnect_with` re-dials bootstrap nodes that restarted. A node's DHT process ends with its owner,
killed or not (`OwnedDHT`). Coroutines here run inside the DHT process (`DHT.run_coroutine`);
hivemind's internals are reached through `hivemind_compat`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any

import hivemind
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr

from p2p_diloco import procs
from p2p_diloco.discovery import hivemind_compat as compat
from p2p_diloco.discovery.patience import try_timeout
from p2p_diloco.errors import BootstrapUnanswered

logger = logging.getLogger(__name__)

DHT_REPLICAS = 20
"""Nodes asked to store each record (hivemind's default is 5). In a swarm of up to this many nodes every
node holds every record, so the frequent poll is a local read and a tombstone is seen at the next one."""
GRACE_S = 5.0
"""A try of the bootstrap nodes that has not come back this long after its own timeout is over."""
_UNREACHABLE_MARKERS = ("failed to connect to bootstrap peers", "none of the initial_peers responded")


class DaemonUnavailable(Exception):
    """The libp2p daemon could not start on this machine (not: the bootstrap did not answer)."""


OWNER_POLL_S = 0.5
"""How often a DHT process looks whether its owner is still there."""


class OwnedDHT(hivemind.DHT):
    """A hivemind DHT process that ends with the process that started it (its owner).

    Forked, the DHT process holds the owner's end of their pipe as well as its own, so it never sees
    the pipe close: an owner killed with SIGKILL left its DHT process and p2pd running for good
    (`bench churn`'s processes left behind). A thread of the DHT process watches the owner; once it
    is gone, it stops what the DHT process started (p2pd) and ends the DHT process."""

    def start(self) -> None:
        self._owner_pid = os.getpid()  # (read in the DHT process: its parent may be gone before it looks)
        super().start()

    def run(self) -> None:
        threading.Thread(target=_end_with_owner, args=(self._owner_pid,), name="dht-owner", daemon=True).start()
        super().run()


def _end_with_owner(owner: int) -> None:
    """In a DHT process: once `owner` is no longer its parent, SIGTERM its children (p2pd), SIGKILL
    those still there after a second, and exit."""
    while os.getppid() == owner:
        time.sleep(OWNER_POLL_S)
    me = os.getpid()
    children = [p.pid for p in procs.processes() if p.ppid == me]
    for pid in children:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    while (children := [pid for pid in children if procs.alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in children:
        _signal(pid, signal.SIGKILL)
    os._exit(0)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _host_maddr(host: str, port: int) -> str:
    return f"/{'ip6' if ':' in host else 'ip4'}/{host}/tcp/{port}"


def start_dht(*, initial_peers: list[str], host: str, port: int, timeout: float, announce_host: str | None = None,
              validators: list | None = None, client_mode: bool = False, identity_path: str | None = None) -> hivemind.DHT:
    """Start a hivemind DHT process (`OwnedDHT`); `DiscoveryError` if no initial peer answers,
    `DaemonUnavailable` if libp2p fails."""
    kwargs: dict[str, Any] = dict(host_maddrs=[_host_maddr(host, port)], client_mode=client_mode,
                                  identity_path=identity_path, num_replicas=DHT_REPLICAS)
    if announce_host:
        if port == 0:  # the announced address needs the port before the daemon picks one
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
            kwargs["host_maddrs"] = [_host_maddr(host, port)]
        kwargs["announce_maddrs"] = [_host_maddr(announce_host, port)]
    dht = OwnedDHT(initial_peers=initial_peers or None, start=False, record_validators=validators or (), **kwargs)
    # The terminal's Ctrl+C reaches the whole foreground process group; the DHT process must not
    # die of it, since its owner may still need it to withdraw its record (the owner stops it with
    # `shutdown()`). hivemind ignores SIGINT in the process only once its loop runs, so it is also
    # ignored while the process is forked, which it inherits (only the main thread may set
    # handlers). SIGHUP stays: after a hangup an owner that does not handle it dies at once, and a
    # DHT process that survived it would run on forever. p2pd, which the DHT process starts once
    # hivemind ignores SIGINT, inherits that, but may turn SIGINT back on: this does not decide it.
    import signal  # local: the only place in this module that deals with signals

    shield = threading.current_thread() is threading.main_thread()
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if shield else None
        try:
            dht.start()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        dht.wait_until_ready(timeout)
    except FutureTimeout as e:
        dht.shutdown()
        raise BootstrapUnanswered(f"no bootstrap node answered within {timeout:g} s (tried {', '.join(initial_peers)})") from e
    except (P2PDaemonError, RuntimeError, OSError) as e:
        dht.shutdown()
        if any(marker in str(e) for marker in _UNREACHABLE_MARKERS):
            raise BootstrapUnanswered(f"none of the bootstrap nodes answered (tried {', '.join(initial_peers)}): {e}") from e
        raise DaemonUnavailable(f"{type(e).__name__}: {str(e).strip()[:300]}") from e
    except BaseException:  # a signal or a crash while it starts: the process must not outlive its owner
        dht.shutdown()
        raise
    return dht


def dial_address(maddr: str) -> Multiaddr:
    """`/ip4/H/tcp/P/p2p/ID` -> `/ip4/H/tcp/P` (the daemon's connect wants the address without the id)."""
    m = Multiaddr(maddr)
    return m.decapsulate(Multiaddr(f"/p2p/{m['p2p']}"))


async def _dial_and_ping(node: Any, maddr: str) -> bool:
    """Dial the bootstrap node at `maddr`, then ping it: whether it answered (a ping that answers
    puts each node in the other's routing table)."""
    peer_id = PeerID.from_base58(Multiaddr(maddr)["p2p"])
    return await compat.dial(node, peer_id, [dial_address(maddr)]) and await compat.ping(node, peer_id)


async def _reconnect(_dht: hivemind.DHT, node: Any, maddrs: list[str]) -> int:
    """Ping the bootstrap peers; one that restarted learns about us again and answers lookups."""
    found = 0
    for maddr in maddrs:
        # a ping over the connection there is, else (it may be stale) dial the known address and ping again
        peer_id = PeerID.from_base58(Multiaddr(maddr)["p2p"])
        if not await compat.ping(node, peer_id) and not await _dial_and_ping(node, maddr):
            logger.debug("bootstrap %s unreachable", maddr)
            continue
        found += 1
    return found


async def _join_through(_dht: hivemind.DHT, node: Any, maddrs: list[str], timeout: float) -> int:
    """hivemind's own bootstrap, through a node that is already up: dial and ping the bootstrap nodes
    (all at once), then, if one answered, look up this node's own id, which fills its routing table
    with its neighbours; the number that answered within `timeout` s."""
    started = time.monotonic()
    tries = [asyncio.ensure_future(_dial_and_ping(node, m)) for m in maddrs]
    done, pending = await asyncio.wait(tries, timeout=timeout)
    for t in pending:
        t.cancel()
    found = sum(1 for t in done if not t.cancelled() and t.exception() is None and t.result())
    if found:
        lookup = asyncio.ensure_future(node.find_nearest_nodes([node.node_id]))
        _, late = await asyncio.wait([lookup], timeout=max(timeout - (time.monotonic() - started), 1.0))
        for t in late:  # the neighbours a late lookup would add, the background reads find too
            t.cancel()
    return found


def try_bootstrap(dht: hivemind.DHT, maddrs: list[str], connect_timeout: float, time_left: float | None) -> int:
    """One try of the bootstrap nodes `maddrs` through the node `dht` (`_join_through`), waiting
    `connect_timeout` s at most (cut to `time_left`): how many answered, or `BootstrapUnanswered`."""
    timeout = try_timeout(connect_timeout, time_left)
    future = dht.run_coroutine(partial(_join_through, maddrs=maddrs, timeout=timeout), return_future=True)
    try:
        found = future.result(timeout=timeout + GRACE_S)
    except FutureTimeout:
        found = 0
    if not found:
        raise BootstrapUnanswered(f"no bootstrap node answered within {timeout:g} s (tried {', '.join(maddrs)})")
    return found


async def _routing_peers(_dht: hivemind.DHT, node: Any) -> list[str]:
    return sorted(str(p) for p in compat.routing_table_peers(node))


def routing_peers(dht: hivemind.DHT) -> list[str]:
    """Peer ids in a DHT node's routing table (the bootstrap node logs joins from this)."""
    return dht.run_coroutine(_routing_peers)


def reconnect_with(maddrs: list[str]) -> Any:
    """`_reconnect` to `maddrs`, as `DHT.run_coroutine` takes it (the membership's thread runs it
    every refresh)."""
    return partial(_reconnect, maddrs=list(maddrs))
