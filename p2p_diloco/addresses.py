"""Bootstrap addresses: one `--bootstrap` flag for both discovery back-ends.

A bootstrap node listens twice: its DHT node at `/ip4/H/tcp/P/p2p/ID` and its ZeroMQ rendezvous at
`tcp://H:P+1` (port + 1 unless told otherwise; it prints both). `--bootstrap` accepts either form,
as often as wanted:

- the DHT back-end uses the multiaddrs;
- the ZeroMQ fallback uses the `tcp://` addresses as given, plus `tcp://H:P+1` derived from each
  multiaddr, so an island that was handed only the DHT address still finds the rendezvous when
  libp2p cannot run on its machine.

Any island's own peer-exchange socket answers the same rendezvous requests, so a `tcp://` address
of a live island works as a bootstrap address for the ZeroMQ fallback too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RENDEZVOUS_PORT_OFFSET = 1
"""The rendezvous listens on the DHT port plus this, unless `--rendezvous-port` says otherwise."""

_MULTIADDR_RE = re.compile(
    r"^/(?P<proto>ip4|ip6|dns|dns4|dns6)/(?P<host>[^/\s]{1,253})/tcp/(?P<port>[0-9]{1,5})/p2p/(?P<peer>[1-9A-HJ-NP-Za-km-z]{20,128})$"
)
_TCP_RE = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]{2,64}\]|[^\s:/\[\]]{1,253}):(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class BootstrapAddress:
    """One parsed `--bootstrap` value."""

    raw: str
    kind: str
    """`dht` for a multiaddr, `zmq` for a tcp:// rendezvous address."""
    host: str
    port: int
    peer_id: str | None = None

    def rendezvous(self) -> str:
        """The ZeroMQ rendezvous endpoint this address stands for."""
        if self.kind == "zmq":
            return self.raw
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port + RENDEZVOUS_PORT_OFFSET}"


def parse(addr: str) -> BootstrapAddress:
    """Parse a multiaddr (`/ip4/H/tcp/P/p2p/ID`) or a rendezvous address (`tcp://H:P`); ValueError if neither."""
    if not isinstance(addr, str):
        raise ValueError(f"bootstrap address must be a string, got {type(addr).__name__}")
    m = _MULTIADDR_RE.match(addr)
    if m:
        port = int(m["port"])
        if not 1 <= port <= 65535 - RENDEZVOUS_PORT_OFFSET:
            raise ValueError(f"port {port} out of range in {addr!r}")
        return BootstrapAddress(addr, "dht", m["host"], port, m["peer"])
    m = _TCP_RE.match(addr)
    if m:
        port = int(m["port"])
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} out of range in {addr!r}")
        return BootstrapAddress(addr, "zmq", m["host"].strip("[]"), port)
    raise ValueError(
        f"{addr!r} is not a bootstrap address: use the multiaddr a bootstrap node prints "
        "(/ip4/HOST/tcp/PORT/p2p/PEER_ID) or its rendezvous address (tcp://HOST:PORT)"
    )


def dht_multiaddrs(bootstrap: tuple[str, ...] | list[str]) -> list[str]:
    """The multiaddrs among the bootstrap addresses, in order."""
    return [a for a in bootstrap if parse(a).kind == "dht"]


def rendezvous_endpoints(bootstrap: tuple[str, ...] | list[str]) -> list[str]:
    """Every rendezvous endpoint the bootstrap addresses stand for, without duplicates, in order."""
    out: list[str] = []
    for a in bootstrap:
        ep = parse(a).rendezvous()
        if ep not in out:
            out.append(ep)
    return out
