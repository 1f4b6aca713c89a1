"""Patient joining on 127.0.0.1: an island started before its bootstrap node keeps trying and joins
once the node is up, over the DHT (real processes) and over ZeroMQ (in process, real sockets);
`join` with a `[discovery] join_timeout` gives up with one clear line and exit code 1, and a signal while it waits
ends it at once."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time

import pytest
from discovery_harness import Bootstrap, Member, announce, free_port_pair, wait_until

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import open_membership
from p2p_diloco.discovery.peerid import peer_id_from_identity
from p2p_diloco.discovery.rendezvous import RendezvousServer

RETRYING = "trying again, with pauses"
"""What an island says, once, when its bootstrap nodes do not answer (`discovery.patience`)."""


@pytest.mark.timeout(90)
def test_a_member_started_before_its_dht_bootstrap_node_joins_once_it_is_up(procs, tmp_path):
    port = free_port_pair()
    identity = tmp_path / "bootstrap.key"  # the node's peer id, known before it runs (the DHT node takes the file)
    maddr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_from_identity(str(identity))}"
    member = Member(procs, tmp_path, 0, [maddr], "dht", "late", expiry=10.0, refresh=1.0, poll=0.5, endpoint_port=20000)
    wait_until(lambda: RETRYING in member.log.read_text() or member.proc.poll() is not None, 40,
               "the member to find no bootstrap node")
    assert member.proc.poll() is None and not member.first("ready"), member.log.read_text()[-3000:]
    boot = Bootstrap(procs, tmp_path, port, "dht")
    boot.start()
    assert boot.multiaddr == maddr
    t_up = time.time()
    wait_until(lambda: member.first("ready") or member.proc.poll() is not None, 40, "the member to join")
    assert member.first("ready"), member.log.read_text()[-3000:]
    assert member.first("ready")["kind"] == "dht"
    print(f"joined {member.first('ready')['t'] - t_up:.1f} s after the bootstrap node printed its address")


@pytest.mark.timeout(30)
def test_an_island_started_before_its_rendezvous_joins_once_it_is_up(caplog):
    port = free_port_pair()
    address = f"tcp://127.0.0.1:{port}"
    config = DiscoveryConfig(run_id="late", bootstrap=(address,), discovery="zmq", connect_timeout=0.5, poll=0.25)
    joined = []
    thread = threading.Thread(target=lambda: joined.append(open_membership(config)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="p2p_diloco.discovery.patience"):
        thread.start()
        wait_until(lambda: any(RETRYING in r.getMessage() for r in caplog.records), 10, "the island to retry")
        server = RendezvousServer("127.0.0.1", port, "test-node").start()
    try:
        thread.join(15)
        assert joined, "the island did not join once the rendezvous was up"
        membership = joined[0]
        assert membership.bootstrap_nodes == {address: "test-node"}
        announce(membership, 7001)
        wait_until(lambda: "late" in server.tables and membership.peer_id in server.tables["late"].records(time.time()), 10,
                   "the rendezvous to list the island")
        membership.leave()
        membership.shutdown()
    finally:
        server.close()
    assert sum(RETRYING in r.getMessage() for r in caplog.records) == 1  # said once


def _join(procs, folder, dead: str, limit: str = "") -> tuple[subprocess.Popen, object]:
    folder.mkdir()
    log = folder / "join.err"
    bounded = f"join_timeout = {limit}\n" if limit else ""
    (folder / "p2p.toml").write_text(f"[discovery]\nconnect_timeout = 1.0\n{bounded}")  # one attempt: 1 s, not 10
    args = ["-m", "p2p_diloco", "--config", str(folder / "p2p.toml"), "join", "--bootstrap", dead, "--discovery", "zmq", "--run-dir",
            str(folder / "run"), "--quiet"]
    return procs.python(*args, stdout=subprocess.DEVNULL, stderr=open(log, "w")), log


@pytest.mark.timeout(90)
def test_join_timeout_gives_up_with_one_clear_line_and_a_signal_ends_the_wait(procs, tmp_path):
    dead = f"tcp://127.0.0.1:{free_port_pair()}"
    bounded, bounded_log = _join(procs, tmp_path / "bounded", dead, "2")
    patient, patient_log = _join(procs, tmp_path / "patient", dead)  # no limit: it waits until stopped
    assert bounded.wait(40) == 1
    text = bounded_log.read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith("Error: no bootstrap node answered within the join timeout of 2 s (")
    assert "no rendezvous answered within" in last and dead in last and "Traceback" not in text
    wait_until(lambda: RETRYING in patient_log.read_text() or patient.poll() is not None, 30, "the island to retry")
    assert patient.poll() is None, patient_log.read_text()
    patient.send_signal(signal.SIGINT)
    assert patient.wait(10) == 130
