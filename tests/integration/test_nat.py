"""Islands behind a real NAT (issue 17): namespaces behind a masquerading router, no port forwarded.

The `nat` fixture builds a `NatNet` (public hosts, and private hosts behind routers) and always
tears it down, processes first. Its topology is `NatNet(public=2, behind=[1])` unless a test asks
for another with `@pytest.mark.parametrize("nat", [dict(public=3, behind=[1, 1])], indirect=True)`.

NAT needs iptables: `nat_unavailable_reason()` installs it at collection when it may (root and
apt-get), outside any test's timeout, and the tests here skip with its reason when NAT cannot work.
`test_the_nat_is_real` checks the set-up itself before any island relies on it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys

import pytest
from discovery_harness import wait_until
from netns import NatNet, nat_unavailable_reason
from swarm_harness import IslandProc

NAT_REASON = nat_unavailable_reason()
pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(NAT_REASON is not None, reason=str(NAT_REASON))]

# Standard library only: these run in the namespaces with `ip netns exec`.
ECHO_PEER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    print(peer[0], flush=True)
    c.sendall(peer[0].encode())
    c.close()
"""
DIAL = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print("sees", c.recv(64).decode())
except OSError as e:
    print("failed", type(e).__name__, e)
"""


@pytest.fixture
def nat(request, procs):
    """A NatNet of the topology in `request.param` (NatNet's keyword arguments), closed at teardown."""
    topology = getattr(request, "param", {"public": 2, "behind": [1]})
    net = NatNet(rate="100mbit", **topology)
    try:
        yield net
    finally:
        procs.cleanup()  # processes first: a namespace with processes inside outlives `ip netns del`
        net.close()


class LineReader:
    """A child's stdout read line by line, each read bounded by a timeout."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else None


def echo_server(procs, prefix: list[str], host: str) -> tuple[LineReader, int]:
    """Starts ECHO_PEER in a namespace; returns its reader (one line per accepted peer) and its port."""
    proc = procs.spawn([*prefix, sys.executable, "-c", ECHO_PEER, host], stdout=subprocess.PIPE, text=True,
                       bufsize=1)
    out = LineReader(proc)
    port = out.line(timeout=20)
    assert port and port.isdigit(), f"echo server on {host} did not start (exit {proc.poll()})"
    return out, int(port)


def dial(prefix: list[str], host: str, port: int, timeout: float = 2.0) -> str:
    """Connects from a namespace; 'sees <address>' when the server answered, else 'failed ...'."""
    r = subprocess.run([*prefix, sys.executable, "-c", DIAL, host, str(port), str(timeout)], capture_output=True,
                       text=True, timeout=timeout + 20)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_nat_is_real(procs, nat):
    # Out through the NAT: the public server sees the router's public address, not the private one.
    public, port = echo_server(procs, nat.public_exec(0), nat.public_address(0))
    assert dial(nat.private_exec(0, 0), nat.public_address(0), port) == f"sees {nat.router_public_address(0)}"
    assert public.line(timeout=5) == nat.router_public_address(0)

    # Nothing in: a server on the private host is reachable on its LAN but not from the public side.
    private, port = echo_server(procs, nat.private_exec(0, 0), "0.0.0.0")
    assert dial(nat.private_exec(0, 0), nat.private_address(0, 0), port) == f"sees {nat.private_address(0, 0)}"
    assert private.line(timeout=5) == nat.private_address(0, 0)
    to_private = dial(nat.public_exec(1), nat.private_address(0, 0), port)
    assert to_private.startswith("failed"), to_private  # no route to the private subnet
    to_router = dial(nat.public_exec(1), nat.router_public_address(0), port)
    assert to_router.startswith("failed"), to_router  # the router forwards no port
    assert private.line(timeout=0.5) is None, "a public host reached the private server"


# -- islands behind the NAT ---------------------------------------------------------------------------------

def _bootstrap(procs, tmp_path, nat, *extra: str, discovery: str = "dht") -> list[str]:
    """A bootstrap node on public host 0; the addresses islands pass to --bootstrap."""
    addr_file = tmp_path / "addrs.txt"
    p = procs.spawn([*nat.public_exec(0), sys.executable, "-m", "p2p_diloco", "bootstrap", "--host",
                     nat.public_address(0), "--port", "7000", "--identity", str(tmp_path / "boot.key"), "--addr-file",
                     str(addr_file), "--discovery", "auto" if discovery == "dht" else "zmq", *extra],
                    stderr=open(tmp_path / "boot.log", "w"))
    wait_until(lambda: addr_file.exists() or p.poll() is not None, 60, "bootstrap addresses")
    addrs = addr_file.read_text().split()
    return [a for a in addrs if a.startswith("/" if discovery == "dht" else "tcp://")]


def _island(procs, tmp_path, name: str, entry: list[str], prefix: list[str], host: str, discovery: str,
            swarm: int) -> IslandProc:
    """An island on `host`; it starts training once it sees all `swarm` islands (so none runs far ahead alone).

    Rounds of 32 steps (about 0.3 s here): islands see each other up to a second or two apart, and
    one that starts that many rounds of 8 steps earlier stays more than `max_staleness` versions ahead,
    where it never fetches from the others (and so, outbound-only, never pushes to them)."""
    return IslandProc(procs, tmp_path, name, entry, "-H", "32", "--max-rounds", "1000", "--host", host,
                      "--wait-for", str(swarm), discovery=discovery, launcher=[*prefix, sys.executable])


def _pushed_from(isl: IslandProc, peer: str) -> int:
    """States `peer` pushed to `isl` that `isl` mixed in (with a weight)."""
    return sum(1 for r in isl.rounds() for p in r.get("pushed_in", ()) if p["partner"] == peer and p["weight"] > 0)


MIN_ROUNDS = int(os.environ.get("NAT_TEST_ROUNDS", "4"))
"""Rounds every island trains at least (more for the longer runs in BENCHMARKS.md)."""


def _train(islands: list[IslandProc], until, timeout: float) -> list[dict]:
    """Let the islands train until `until()` holds and each did MIN_ROUNDS rounds, stop them, return their summaries."""
    wait_until(lambda: (until() and all(len(i.rounds()) >= MIN_ROUNDS for i in islands))
               or any(i.proc.poll() is not None for i in islands), timeout, "the islands to exchange through the NAT")
    for isl in islands:
        isl.signal(signal.SIGTERM)
    return [isl.summary(60, expect=143) for isl in islands]


def _learned(summaries: list[dict], islands: list[IslandProc]) -> None:
    """Loss fell on every island; prints each one's figures (`pytest -s` shows them: BENCHMARKS.md)."""
    ids = {isl.peer_id: isl.name for isl in islands}
    for isl, s in zip(islands, summaries):
        print(json.dumps({"island": isl.name, "reach": s["reach"], "rounds": s["rounds"],
                          "initial_loss": round(s["initial_loss"], 3), "eval_loss": round(s["eval_loss"], 3),
                          "fetched_and_mixed": sorted(ids.get(p, p) for p in isl.mixed_partners()),
                          "pushed_to_it_and_mixed": {ids[p]: _pushed_from(isl, p) for p in ids if _pushed_from(isl, p)},
                          "pushes_sent": s["pushes_sent"], "pushes_failed": s["pushes_failed"],
                          "bytes_out": s["bytes_out"]}))
    at_init = max(s["initial_loss"] for s in summaries)
    for s in summaries:
        assert s["eval_loss"] < at_init - 0.8, s


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nat", [dict(public=3, behind=[1])], indirect=True)
def test_an_island_behind_nat_takes_part_without_port_forwarding(procs, tmp_path, nat):
    entry = _bootstrap(procs, tmp_path, nat)
    reachable = [_island(procs, tmp_path, f"pub{i}", entry, nat.public_exec(i), nat.public_address(i), "dht", 3)
                 for i in (1, 2)]
    natted = _island(procs, tmp_path, "nat", entry, nat.private_exec(0, 0), nat.private_address(0, 0), "dht", 3)
    nat_id = natted.peer_id
    summaries = _train([*reachable, natted], lambda: sum(_pushed_from(r, nat_id) for r in reachable) >= 2
                       and natted.mixed_partners(), 200)
    assert [s["reach"] for s in summaries] == ["direct", "direct", "outbound"]
    assert "not reachable from outside" in natted.tail(20000)  # what its owner reads
    # its updates reach the others (they mixed the states it pushed) and it learns from them
    assert sum(_pushed_from(r, nat_id) for r in reachable) >= 2 and summaries[2]["pushes_sent"] >= 2
    assert natted.mixed_partners() <= {r.peer_id for r in reachable}
    _learned(summaries, [*reachable, natted])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nat", [dict(public=2, behind=[1, 1])], indirect=True)
def test_two_islands_behind_nat_learn_through_a_reachable_one(procs, tmp_path, nat):
    entry = _bootstrap(procs, tmp_path, nat, discovery="zmq")
    hub = _island(procs, tmp_path, "hub", entry, nat.public_exec(1), nat.public_address(1), "zmq", 3)
    natted = [_island(procs, tmp_path, f"nat{r}", entry, nat.private_exec(r, 0), nat.private_address(r, 0), "zmq", 3)
              for r in (0, 1)]
    ids = [n.peer_id for n in natted]
    summaries = _train([hub, *natted], lambda: all(_pushed_from(hub, i) for i in ids)
                       and all(n.mixed_partners() for n in natted), 200)
    assert [s["reach"] for s in summaries] == ["direct", "outbound", "outbound"]
    assert all(n.mixed_partners() == {hub.peer_id} for n in natted)  # they cannot dial each other
    _learned(summaries, [hub, *natted])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nat", [dict(public=1, behind=[1, 1])], indirect=True)
def test_the_bootstrap_relay_carries_a_swarm_with_no_reachable_island(procs, tmp_path, nat):
    entry = _bootstrap(procs, tmp_path, nat, "--relay", discovery="zmq")
    natted = [_island(procs, tmp_path, f"nat{r}", entry, nat.private_exec(r, 0), nat.private_address(r, 0), "zmq", 2)
              for r in (0, 1)]
    ids = [n.peer_id for n in natted]
    summaries = _train(natted, lambda: natted[0].mixed_partners() == {ids[1]} and natted[1].mixed_partners() == {ids[0]},
                       200)
    assert [s["reach"] for s in summaries] == ["outbound", "outbound"]
    assert "relaying states" in (tmp_path / "boot.log").read_text()
    _learned(summaries, natted)
