"""Separate hosts, not just separate ports: bootstrap and islands in their own network namespaces.

Each host has a private address on a bridge and a tbf-limited link; islands bind one address and
must announce a reachable one. One island binds 0.0.0.0 and announces its address with
`--announce`, which is how a machine behind a bind-all socket tells peers where to dial.
"""

from __future__ import annotations

import sys

import pytest
from netns import HostNet, unavailable_reason
from swarm_harness import IslandProc, run_until_mixed, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def net(procs):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    n = HostNet(hosts=4, rate="100mbit")
    try:
        yield n
    finally:
        procs.cleanup()  # processes first: a namespace with processes inside outlives `ip netns del`
        n.close()


def test_swarm_trains_across_namespaces(procs, tmp_path, net):
    boot_cmd = [*net.exec_prefix(0), sys.executable]
    addr_file = tmp_path / "addrs.txt"
    p = procs.spawn([*boot_cmd, "-m", "p2p_diloco", "bootstrap", "--host", net.address(0), "--port", "7000",
                     "--identity", str(tmp_path / "boot.key"), "--addr-file", str(addr_file)],
                    stderr=open(tmp_path / "boot.log", "w"))
    wait_until(lambda: addr_file.exists() or p.poll() is not None, 60, "bootstrap addresses")
    entry = [a for a in addr_file.read_text().split() if a.startswith("/")]
    assert entry and all(net.address(0) in a for a in entry), entry
    islands = []
    for i in (1, 2, 3):
        host = ["--host", net.address(i)] if i < 3 else ["--host", "0.0.0.0", "--announce", net.address(i)]
        islands.append(IslandProc(procs, tmp_path, f"h{i}", entry, "-H", "10", "--max-rounds", "1000", *host,
                                  discovery="dht", launcher=[*net.exec_prefix(i), sys.executable]))
    summaries = run_until_mixed(islands, 8, 200)
    by_id = {s["peer_id"]: i for i, s in enumerate(summaries, start=1)}
    at_init = max(s["initial_loss"] for s in summaries)  # a later island may join from the swarm's state
    for isl, s in zip(islands, summaries):
        assert s["eval_loss"] < min(s["initial_loss"], at_init - 0.8), s
        assert isl.mixed_partners() <= set(by_id) - {s["peer_id"]}
    endpoints = {json_endpoint(isl) for isl in islands}
    assert endpoints == {f"tcp://{net.address(i)}" for i in (1, 2, 3)}, endpoints


def json_endpoint(isl: IslandProc) -> str:
    import json

    return json.loads((isl.run_dir / "island.json").read_text())["endpoint"].rsplit(":", 1)[0]
