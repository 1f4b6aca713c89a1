"""Private hosts on one machine: network namespaces on one bridge, each host's uplink a tbf rate limit.

`HostNet` is a flat network: hosts on one bridge, host i at `address(i)` in 10.213.77.0/24. The
bridge lives in a namespace of its own, so no address of these hosts is ever configured or routed
in the machine's own namespace: their traffic stays between the namespaces made here, and `close()`
deletes them all. `bench links` changes a host's rate (`set_rate`) and cuts hosts off from each
other with iptables rules inside their namespaces (`drop_from`, `drop_all`, `clear`); the
integration tests build on `Namespaces` too (their `NatNet` puts hosts behind NAT routers).

Everything here needs root and iproute2 (`ip`, `tc`); the filters need iptables:
`unavailable_reason()` and `iptables_binary()` say whether this machine has them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import uuid
from typing import Iterator

SUBNET = "10.213.77"
"""HostNet's hosts (and NatNet's public bridge)."""

SBIN_PATH = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
"""Where the network tools are looked for: sbin is off a plain user's PATH."""


def ip(*args: str) -> None:
    """`ip ARGS`, which must succeed."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def in_ns(ns: str, *args: str) -> str:
    """Runs a command inside namespace `ns`, which must succeed; returns its output."""
    return subprocess.run(["ip", "netns", "exec", ns, *args], check=True, capture_output=True, text=True,
                          timeout=30).stdout


def tbf(rate: str) -> list[str]:
    """A tbf qdisc's parameters for `rate` (a tc rate: 1000mbit, 500kbit): a burst of a few ms of the
    rate (at least one full frame) so that a slow link is slow from its first byte, and a queue of
    about 200 ms at slow rates, as a real uplink's buffer, 50 ms at fast ones."""
    bits = _bits(rate)
    burst = max(16 * 1024, int(bits / 8 * 0.004)) if bits >= 10e6 else max(4 * 1024, int(bits / 8 * 0.02))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms" if bits >= 10e6 else "200ms"]


def _bits(rate: str) -> float:
    """A tc rate (`200mbit`, `500kbit`, `1gbit`, `64kbit`) in bit/s."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"a tc rate such as 100mbit or 500kbit, got {rate!r}")


class Namespaces:
    """The namespaces of one network, named with a random tag and deleted together by `close()`.

    `close()` only deletes namespaces: the caller kills the processes it started in them first, since
    a namespace that still holds a process outlives `ip netns del` (and keeps its addresses).
    """

    def __init__(self, rate: str) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.rate = rate
        self.created: list[str] = []

    @contextlib.contextmanager
    def _undo_on_error(self) -> Iterator[None]:
        """Deletes what a half-built network made: the caller never gets an object to close."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> str:
        ip("netns", "add", name)
        self.created.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def _switch(self, name: str) -> str:
        """A namespace holding nothing but the bridge `br0`: a switch that no host's address lives on."""
        self._netns(name)
        ip("-n", name, "link", "add", "br0", "type", "bridge")
        ip("-n", name, "link", "set", "br0", "up")
        return name

    def _plug(self, ns: str, dev: str, switch: str, port: str, cidr: str, limit: bool = True) -> None:
        """Cables `ns`'s interface `dev` (address `cidr`) to port `port` of `switch`'s bridge.

        With `limit`, `dev` sends through a tbf at the network's rate: the host's own uplink.
        """
        ip("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", switch)
        ip("-n", ns, "addr", "add", cidr, "dev", dev)
        ip("-n", ns, "link", "set", dev, "up")
        ip("-n", switch, "link", "set", port, "master", "br0")
        ip("-n", switch, "link", "set", port, "up")
        if limit:
            in_ns(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, "burst", "256kb",
                  "latency", "50ms")

    def close(self) -> None:
        """Deletes every namespace; kill the processes started in them before calling it."""
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()


class HostNet(Namespaces):
    """`hosts` namespaces on one bridge, host i at `address(i)` in 10.213.77.0/24, each sending
    through a tbf at `rate` on its `eth0`."""

    def __init__(self, hosts: int, rate: str = "200mbit") -> None:
        assert 1 <= hosts <= 200, hosts
        super().__init__(rate)
        self.names = [f"p2ph{self.tag}{i}" for i in range(hosts)]
        with self._undo_on_error():
            self.switch = self._switch(f"p2psw{self.tag}")
            for i, ns in enumerate(self.names):
                self._netns(ns)
                self._plug(ns, "eth0", self.switch, f"port{i}", f"{self.address(i)}/24")

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program inside host `i`."""
        return ["ip", "netns", "exec", self.names[i]]

    def set_rate(self, i: int, rate: str) -> None:
        """Host `i`'s uplink (its `eth0`'s tbf) at `rate` from now on (`tbf`: burst and queue to fit it)."""
        in_ns(self.names[i], "tc", "qdisc", "change", "dev", "eth0", "root", *tbf(rate))

    def drop_all(self, i: int, iptables: str) -> None:
        """Host `i` receives nothing on its link (loopback still works): with `drop_from` on the others,
        its cable is cut, silently, as a link that goes down mid-route (no error reaches a sender)."""
        in_ns(self.names[i], iptables, "-w", "10", "-A", "INPUT", "-i", "eth0", "-j", "DROP")

    def drop_from(self, i: int, sources: list[int], iptables: str) -> None:
        """Host `i` drops whatever arrives from the hosts `sources`: silence, never a refusal."""
        for j in sources:
            in_ns(self.names[i], iptables, "-w", "10", "-A", "INPUT", "-s", self.address(j), "-j", "DROP")

    def clear(self, i: int, iptables: str) -> int:
        """Removes host `i`'s input filters (`drop_all`, `drop_from`); returns the packets they dropped."""
        listing = in_ns(self.names[i], iptables, "-w", "10", "-nvxL", "INPUT")
        dropped = sum(int(line.split()[0]) for line in listing.splitlines()
                      if line.split() and line.split()[0].isdigit() and " DROP " in f" {line} ")
        in_ns(self.names[i], iptables, "-w", "10", "-F", "INPUT")
        return dropped


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip", path=SBIN_PATH) is None or shutil.which("tc", path=SBIN_PATH) is None:
        return "iproute2 (ip, tc) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"p2pprobe{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def iptables_binary() -> tuple[str | None, str | None]:
    """(binary, None) with the first iptables that can filter inside a namespace, else (None, why):
    namespaces first (`unavailable_reason`), then `iptables` and `iptables-legacy` (either back-end
    can be missing from a kernel), each tried on a throwaway namespace with a tbf on its loopback."""
    return _filter_support()


@functools.cache
def _filter_support() -> tuple[str | None, str | None]:
    reason = unavailable_reason()
    if reason:
        return None, reason
    binaries = [b for b in (shutil.which(n, path=SBIN_PATH) for n in ("iptables", "iptables-legacy")) if b]
    if not binaries:
        return None, "iptables is not installed"
    probe = f"p2pprobe{uuid.uuid4().hex[:6]}"
    failures = []
    ip("netns", "add", probe)
    try:
        try:
            in_ns(probe, "tc", "qdisc", "add", "dev", "lo", "root", *tbf("500kbit"))
        except subprocess.CalledProcessError as e:
            return None, f"tc cannot add a tbf qdisc: {(e.stderr or '').strip() or e}"
        for binary in binaries:
            try:
                in_ns(probe, binary, "-w", "10", "-A", "INPUT", "-s", f"{SUBNET}.250", "-j", "DROP")
                return binary, None
            except subprocess.CalledProcessError as e:
                last = (e.stderr or "").strip().splitlines()[-1:]
                failures.append(f"{os.path.basename(binary)}: {last[0] if last else e}")
        return None, "no iptables can filter in a namespace: " + "; ".join(failures)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
