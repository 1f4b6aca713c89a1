"""A light island for the discovery tests and `bench discovery`: it only announces and watches, it
does not train (`python -m p2p_diloco.bench.lightmember`).

It joins a run, announces a record whose version grows every `--bump` seconds, and prints one JSON
object per line on stdout:

    {"event": "ready", "t": ..., "peer_id": ..., "kind": "dht"|"zmq"}   after its first announce
    {"event": "view", "t": ..., "peers": [...]}     whenever the set of visible peer ids changes
    {"event": "left", "t": ...}                     after a clean leave (on SIGTERM)
    {"event": "sealed", "t": ..., "hidden": n, "refused": n}   when either count becomes non-zero

`t` is unix time, so the test can measure how long joins and departures take to be seen. The swarm
secret, if any, comes from the environment (`P2P_DILOCO_SECRET`), as a careful user would pass it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.discovery import open_membership
from p2p_diloco.discovery.records import IslandRecord


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--run-id", default="test")
    p.add_argument("--discovery", default="auto")
    p.add_argument("--expiry", type=float, default=30.0)
    p.add_argument("--refresh", type=float, default=5.0)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--endpoint-port", type=int, required=True)
    p.add_argument("--bump", type=float, default=1.0, help="seconds between version increments")
    p.add_argument("--connect-timeout", type=float, default=20.0, help="seconds a try of the bootstrap nodes waits")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")

    started = time.time()
    config = DiscoveryConfig(run_id=args.run_id, bootstrap=tuple(args.bootstrap), discovery=args.discovery,
                             expiry=args.expiry, refresh=args.refresh, poll=args.poll, connect_timeout=args.connect_timeout,
                             secret=os.environ.get("P2P_DILOCO_SECRET") or None)
    membership = open_membership(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after open: a forked DHT process keeps the default

    record = IslandRecord(peer_id=membership.peer_id, endpoint=f"tcp://127.0.0.1:{args.endpoint_port}",
                          state="training", started_at=started, timestamp=time.time())
    membership.announce(record)
    emit("ready", peer_id=membership.peer_id, kind=membership.kind)
    seen: list[str] | None = None
    counts = (False, False)
    last_bump = time.monotonic()
    while not stop.wait(0.05):
        if time.monotonic() - last_bump >= args.bump:
            record = record.replace(version=record.version + 1, tokens=record.tokens + 4096, timestamp=time.time())
            membership.announce(record)
            last_bump = time.monotonic()
        peers = sorted(membership.members())
        if peers != seen:
            emit("view", peers=peers)
            seen = peers
        hidden, refused = membership.sealed_hidden(), membership.refused_records()
        if (hidden > 0, refused > 0) != counts:
            counts = (hidden > 0, refused > 0)
            emit("sealed", hidden=hidden, refused=refused)
    membership.leave()
    emit("left")
    membership.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
