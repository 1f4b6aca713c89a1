"""Private test hosts on one machine: network namespaces joined by bridges, with tbf rate limits.

`HostNet` is a flat network: hosts on one bridge; it, the namespaces' base class and
`unavailable_reason` live in the product (`p2p_diloco.bench.netns`, which `bench links` runs its
swarms on) and are imported here. `NatNet` adds home networks: hosts on a private LAN behind a router namespace that masquerades them onto the public bridge and lets nothing in
that they did not start, as a real NAT does (issue 17).

Every bridge lives in a namespace of its own, so no address of these hosts is ever configured or
routed in the machine's own namespace: their traffic stays between the namespaces this test
creates, and everything is deleted at teardown.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid

from p2p_diloco.bench.netns import SUBNET, HostNet, unavailable_reason  # noqa: F401 (the tests' names)
from p2p_diloco.bench.netns import Namespaces as _Namespaces
from p2p_diloco.bench.netns import in_ns as _in
from p2p_diloco.bench.netns import ip as _ip

PRIVATE = "10.214"  # NatNet's router r has the LAN 10.214.r.0/24
APT_TIMEOUT = 240  # seconds for one apt-get call


class NatNet(_Namespaces):
    """Public hosts on a bridge, and private hosts on LANs behind masquerading routers.

    `NatNet(public=3, behind=[1, 2])` makes public hosts 0..2 at 10.213.77.1-3 and two routers: router 0
    (public address 10.213.77.201) with one private host at 10.214.0.2, router 1 (10.213.77.202) with two
    at 10.214.1.2-3. `public_address`/`public_exec` (or HostNet's names `address`/`exec_prefix`) and
    `private_address`/`private_exec` give each host's address and the command prefix that runs in it.

    Each router is a namespace with `wan` on the public bridge and `lan` on its LAN's own switch
    namespace (a bridge outside the router, so bridge netfilter, if loaded, never filters the LAN's
    own traffic). It forwards, masquerades whatever leaves through `wan`, and forwards from `wan` to
    `lan` only what belongs to a connection a private host started: no port is forwarded. Public
    hosts have no route to the private subnets; private hosts route everything through their router.
    Host links (public and private) are tbf-limited at `rate`, as in HostNet; router legs are not.
    """

    def __init__(self, public: int, behind: list[int], rate: str = "200mbit") -> None:
        assert public <= 200 and len(behind) <= 50 and all(0 <= n <= 250 for n in behind), (public, behind)
        super().__init__(rate)
        iptables = nat_iptables()
        assert iptables, f"NAT is unavailable here: {nat_unavailable_reason()}"
        self.names = [f"p2ph{self.tag}{i}" for i in range(public)]
        self.routers = [f"p2pr{self.tag}{r}" for r in range(len(behind))]
        self.private = [[f"p2pp{self.tag}{r}_{j}" for j in range(n)] for r, n in enumerate(behind)]
        with self._undo_on_error():
            self.switch = self._switch(f"p2psw{self.tag}")
            for i, ns in enumerate(self.names):
                self._netns(ns)
                self._plug(ns, "eth0", self.switch, f"port{i}", f"{self.public_address(i)}/24")
            for r in range(len(behind)):
                self._router(r, iptables)
                lan = self._switch(f"p2pl{self.tag}{r}")
                self._plug(self.routers[r], "lan", lan, "router", f"{PRIVATE}.{r}.1/24", limit=False)
                for j, ns in enumerate(self.private[r]):
                    self._netns(ns)
                    self._plug(ns, "eth0", lan, f"port{j}", f"{self.private_address(r, j)}/24")
                    _ip("-n", ns, "route", "add", "default", "via", f"{PRIVATE}.{r}.1")

    def _router(self, r: int, iptables: str) -> None:
        ns = self._netns(self.routers[r])
        self._plug(ns, "wan", self.switch, f"router{r}", f"{self.router_public_address(r)}/24", limit=False)
        _in(ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")  # per namespace: only this router
        for rule in (["-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"],
                     ["-P", "FORWARD", "DROP"],
                     ["-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT"],
                     ["-A", "FORWARD", "-i", "wan", "-o", "lan", "-m", "conntrack", "--ctstate",
                      "ESTABLISHED,RELATED", "-j", "ACCEPT"]):
            _in(ns, iptables, "-w", "10", *rule)

    @staticmethod
    def public_address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def public_exec(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    address, exec_prefix = public_address, public_exec  # HostNet's names, for code written for either

    @staticmethod
    def router_public_address(r: int) -> str:
        return f"{SUBNET}.{201 + r}"

    @staticmethod
    def private_address(r: int, j: int) -> str:
        return f"{PRIVATE}.{r}.{j + 2}"

    def private_exec(self, r: int, j: int) -> list[str]:
        return ["ip", "netns", "exec", self.private[r][j]]


def nat_unavailable_reason() -> str | None:
    """Why NatNet cannot be built here, or None when it can (installs iptables once if it may)."""
    return _nat_support()[1]


def nat_iptables() -> str | None:
    """The iptables binary that passed the masquerade probe, or None."""
    return _nat_support()[0]


@functools.cache
def _nat_support() -> tuple[str | None, str | None]:
    """(binary, None) with the first iptables that can masquerade in a namespace, else (None, reason).

    Cached: the install is tried once per process. Both `iptables` (nft or legacy, whichever the
    alternatives system picked) and `iptables-legacy` are tried, since either back-end can be missing
    from a kernel.
    """
    reason = unavailable_reason()
    if reason:
        return None, reason
    if not _binaries():
        reason = _install_iptables()
        if reason:
            return None, reason
    failures = []
    for binary in _binaries():
        failure = _probe_masquerade(binary)
        if failure is None:
            return binary, None
        failures.append(f"{os.path.basename(binary)}: {failure}")
    return None, "no iptables can masquerade in a namespace (kernel without netfilter?): " + "; ".join(failures)


def _binaries() -> list[str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"  # sbin is off a plain user's PATH
    return [b for b in (shutil.which(n, path=path) for n in ("iptables", "iptables-legacy")) if b]


def _install_iptables() -> str | None:
    """Installs iptables with apt-get (an `apt-get update` first only if a plain install fails)."""
    if shutil.which("apt-get") is None:
        return "iptables is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=60", "iptables"]
    out = ""
    for step in (install, ["apt-get", "update", "-qq"], install):
        try:
            r = subprocess.run(step, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(step)}` took over {APT_TIMEOUT} s"
        out = (r.stdout + r.stderr).strip() or f"`{' '.join(step)}` exited with {r.returncode}"
        if step is install and r.returncode == 0:
            break
    if not _binaries():
        return f"iptables is not installed and apt-get could not install it: {out[-300:]}"
    return None


def _probe_masquerade(binary: str) -> str | None:
    """Adds NatNet's rules in a throwaway namespace; the error of the first that fails, or None."""
    probe = f"p2pnat{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", probe)
    try:
        for rule in (["-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"],
                     ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]):
            r = subprocess.run(["ip", "netns", "exec", probe, binary, "-w", "10", *rule], capture_output=True,
                               text=True, timeout=30)
            if r.returncode != 0:
                return (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]
        return None
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
