"""Discovery over the hivemind DHT on 127.0.0.1: a swarm of real processes, and in-process nodes
(each a real hivemind DHT with its libp2p daemon) for forged records, run isolation and the fallback."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from functools import partial

import pytest
from discovery_harness import (
    Bootstrap, announce, assert_runs_isolated, assert_swarm_figures, free_port_pair, run_sealed, run_swarm, two_runs,
    wait_until
)
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from p2p_diloco.bootstrap import BootstrapNode

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import dht, dhtnode, hivemind_compat, open_membership
from p2p_diloco.discovery.records import IslandRecord, fingerprint
from p2p_diloco.errors import DiscoveryError


@pytest.mark.timeout(240)
def test_swarm_of_eight_over_dht(procs, tmp_path):
    figures = run_swarm(procs, tmp_path, "dht")
    print("dht figures:", figures)
    assert_swarm_figures(figures)


# -- in-process nodes: forged records, run isolation, the automatic fallback --------------------

@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A bootstrap node, islands A and B of run r1, island C of run r2, all in this process."""
    boot = BootstrapNode(port=free_port_pair(), identity=tmp_path_factory.mktemp("boot") / "id.key")
    boot.start()
    try:
        with two_runs(tuple(boot.addresses[:1]), "dht", 20) as (a, b, c, recs):
            yield boot, a, b, c, recs
    finally:
        boot.shutdown()


@pytest.mark.timeout(60)
def test_runs_sharing_a_dht_do_not_see_each_other(swarm):
    boot, a, b, c, recs = swarm
    assert_runs_isolated(a, b, c, recs)


async def _store_at(_dht, node, target: str, maddrs: list[str], key: str, subkey: bytes, value, signer, pad: int = 0):
    """Send one raw store request, signed by `signer`, to one chosen node (what a malicious peer can do).

    The value is built here, inside the DHT process: hivemind's pipe to it does not carry 100 kB.
    """
    if pad:
        value = {**value, "endpoint": "tcp://" + "a" * pad + ":1"}
    expiration = get_dht_time() + 30
    key_id = DHTID.generate(source=key)
    rec = DHTRecord(key_id.to_bytes(), MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(value), expiration)
    peer = PeerID.from_base58(target)
    assert await hivemind_compat.dial(node, peer, [dhtnode.dial_address(m) for m in maddrs])
    ok = await node.protocol.call_store(peer, [key_id], [signer.sign_value(rec)], [expiration], subkeys=[subkey])
    return None if ok is None else list(ok)  # a protobuf field does not cross the process boundary


def forged_cases(victim_subkey: bytes, victim: IslandRecord, own_subkey: bytes) -> dict[str, dict]:
    """name -> keyword arguments of `_store_at`: what mallory tries to store, under which subkey."""
    mine = victim.replace(peer_id=fingerprint(own_subkey)).to_dict()
    return {
        "off-schema": dict(subkey=own_subkey, value={**mine, "version": "many"}),
        "huge": dict(subkey=own_subkey, value=mine, pad=100_000),
        "impersonation": dict(subkey=own_subkey, value=victim.to_dict()),
        "overwrite": dict(subkey=victim_subkey, value={**victim.to_dict(), "endpoint": "tcp://6.6.6.6:6666"}),
        "forged-leave": dict(subkey=victim_subkey, value=None),
    }


@pytest.mark.timeout(90)
def test_forged_and_malformed_records_are_refused(swarm):
    boot, a, b, c, recs = swarm
    mallory = dhtnode.start_dht(initial_peers=boot.addresses[:1], host="127.0.0.1", port=0, timeout=20)
    try:
        targets = {"A": (a.libp2p_peer_id, a.visible_maddrs()), "B": (b.libp2p_peer_id, b.visible_maddrs()),
                   "bootstrap": (boot.peer_id, boot.multiaddrs)}
        verdicts = {}
        signer = RSASignatureValidator(RSAPrivateKey())  # mallory's own key
        for name, case in forged_cases(a._subkey, recs[a.peer_id], signer.local_public_key).items():
            for where, (pid, maddrs) in targets.items():
                verdicts[name, where] = mallory.run_coroutine(partial(
                    _store_at, target=pid, maddrs=maddrs, key=dht.islands_key("r1"), signer=signer, **case))
        for name in ("off-schema", "huge", "impersonation", "overwrite", "forged-leave"):
            assert verdicts[name, "A"] == [False] and verdicts[name, "B"] == [False], (name, verdicts)
        # the bootstrap cannot know run r1's schema, but it checks signatures like everyone
        assert verdicts["overwrite", "bootstrap"] == [False] and verdicts["forged-leave", "bootstrap"] == [False]
        assert verdicts["off-schema", "bootstrap"] == [True]  # ...and readers drop that node's copy:
        watcher = open_membership(DiscoveryConfig(run_id="r1", bootstrap=tuple(boot.multiaddrs), discovery="dht"),
                                  observer=True)
        try:
            for view in (watcher.refresh(), a.refresh(), b.refresh()):
                assert set(view) == {a.peer_id, b.peer_id}
                assert view[a.peer_id] == recs[a.peer_id]  # endpoint untouched
        finally:
            watcher.shutdown()
    finally:
        mallory.shutdown()


@pytest.mark.timeout(150)
def test_sealed_records_keep_outsiders_out_over_the_dht(swarm, procs, tmp_path):
    """Under a swarm secret, outsiders reach no member's list and list no member; the bootstrap
    node, which holds no secret, stores the sealed records all the same."""
    boot = swarm[0]
    figures = run_sealed(procs, tmp_path, "dht", boot.multiaddrs[:1])
    print("sealed dht figures:", figures)


@pytest.mark.timeout(90)
def test_auto_falls_back_to_zeromq_when_the_daemon_cannot_start(swarm, caplog):
    """libp2p cannot listen on a port that is taken: `auto` warns with the reason and uses ZeroMQ."""
    boot = swarm[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        base = dict(run_id="fallback", bootstrap=tuple(boot.multiaddrs), expiry=8.0, refresh=1.0, poll=0.25, port=port)
        with pytest.raises(DiscoveryError, match="libp2p daemon could not start"):
            open_membership(DiscoveryConfig(discovery="dht", **base))
        with caplog.at_level(logging.WARNING):
            d = open_membership(DiscoveryConfig(discovery="auto", **base))
    e = open_membership(DiscoveryConfig(**{**base, "discovery": "zmq", "port": 0}))
    try:
        assert d.kind == "zmq" and e.kind == "zmq"
        assert any("libp2p daemon could not start" in r.message and "address already in use" in r.message
                   for r in caplog.records)
        announce(d, 7001)
        announce(e, 7002)
        wait_until(lambda: set(d.members()) == set(e.members()) == {d.peer_id, e.peer_id}, 10,
                   "the fallback islands to meet through the rendezvous derived from the multiaddr")
    finally:
        d.shutdown()
        e.shutdown()


@pytest.mark.timeout(60)
def test_status_against_a_dead_address_fails_readably(tmp_path):
    dead = f"/ip4/127.0.0.1/tcp/{free_port_pair()}/p2p/QmYunsfm4xYoHz4uJMkxLXo4pXxjcCXHSoV3r3ukZQ1wcE"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "p2p_diloco", "status", "--bootstrap", dead, "--run-id", "x",
                          "--discovery", "dht", "--timeout", "5"], capture_output=True, text=True, timeout=50)
    took = time.monotonic() - t0
    print(f"dead DHT address: exit {out.returncode} after {took:.1f} s: {out.stderr.strip()}")
    assert out.returncode == 1
    assert out.stderr.startswith("Error: none of the bootstrap nodes answered") and "Traceback" not in out.stderr
    assert took < 30


@pytest.mark.timeout(60)
def test_any_reachable_bootstrap_is_enough(swarm):
    boot, a, b, c, recs = swarm
    dead = f"/ip4/127.0.0.1/tcp/{free_port_pair()}/p2p/QmYunsfm4xYoHz4uJMkxLXo4pXxjcCXHSoV3r3ukZQ1wcE"
    watcher = open_membership(DiscoveryConfig(run_id="r1", bootstrap=(dead, *boot.multiaddrs), discovery="dht"),
                              observer=True)
    try:
        assert set(watcher.refresh()) == {a.peer_id, b.peer_id}
    finally:
        watcher.shutdown()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig,group,code", [(signal.SIGTERM, False, 0), (signal.SIGINT, True, 130)])
def test_bootstrap_stops_cleanly_and_keeps_its_peer_id(procs, tmp_path, sig, group, code):
    """SIGTERM to the process (a service manager), SIGINT to its whole group (Ctrl+C in a terminal)."""
    boot = Bootstrap(procs, tmp_path, free_port_pair(), "auto")
    first = boot.start()
    assert first[1] == f"tcp://127.0.0.1:{boot.port + 1}"  # the rendezvous sits at the DHT port + 1
    (os.killpg if group else os.kill)(boot.proc.pid, sig)
    assert boot.proc.wait(15) == code
    assert "bootstrap node stopped" in boot.log.read_text()
    wait_until(lambda: not group_alive(boot.proc.pid), 10, "the DHT process and the libp2p daemon to exit too")
    assert (tmp_path / "bootstrap.key").stat().st_mode & 0o077 == 0  # a private key: owner-only
    assert boot.start() == first  # same identity file and port: the same addresses, peer id included
    assert boot.stop(signal.SIGTERM) == 0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


OWNER = """
import sys, time
from p2p_diloco.discovery.dhtnode import start_dht
dht = start_dht(initial_peers=[], host="127.0.0.1", port=0, timeout=60)
print(dht.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(120)
def test_a_dht_process_and_its_daemon_end_with_an_owner_killed_with_sigkill(procs):
    from p2p_diloco.bench.churn import session_processes

    owner = procs.python("-c", OWNER, stdout=subprocess.PIPE, text=True)
    dht_pid = int(owner.stdout.readline())
    session = {owner.pid}
    started = session_processes(session)
    assert any(line.startswith(f"{dht_pid} ") for line in started) and any("p2pd" in line for line in started), started
    owner.send_signal(signal.SIGKILL)  # as `kill -9` does: the process alone, not its group
    owner.wait(10)
    deadline = time.monotonic() + 15
    while (left := session_processes(session)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"left behind by a killed owner: {left}"
