"""A snapshot server or fetcher in its own process, for the multi-process transport tests.

    serve [--numel N --version V --codec C --latency-ms L --bandwidth-mbps B --secret S --retain R]
        prints {"endpoint": ...} once serving, then obeys stdin lines and answers each with one
        JSON line: `publish V` (publish state V), `stats` (server stats plus this process's RSS).
        Exits when stdin closes.
    fetch ENDPOINT [--secret S --timeout T]
        prints {"event": "start"}, fetches, prints {"event": "done", "version": ..., "ok": ...}.

`make_state(numel, version)` is the deterministic state both sides can rebuild to compare;
`Peer` and `start_server` drive such a child from a test.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading

import torch


class Peer:
    """A child process speaking JSON lines."""

    def __init__(self, procs, *args: str) -> None:
        self.proc = procs.python(__file__, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))

    def next(self, timeout: float = 60.0) -> dict:
        return self._lines.get(timeout=timeout)

    def cmd(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.next()


def start_server(procs, *args: str) -> tuple[Peer, str]:
    """Start a serving child with `serve` arguments; return it and its endpoint."""
    peer = Peer(procs, "serve", *args)
    return peer, peer.next()["endpoint"]


def make_state(numel: int, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"phi": torch.randn(numel, generator=g), "m": torch.randn(numel // 2, generator=g)}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def emit(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def serve(a: argparse.Namespace) -> None:
    from p2p_diloco.config import NetworkConfig
    from p2p_diloco.exchange.linkemu import EmulatedLink
    from p2p_diloco.exchange.server import SnapshotServer

    cfg = NetworkConfig(compression=a.codec, retain_snapshots=a.retain)
    with SnapshotServer(config=cfg, secret=a.secret, link=EmulatedLink(a.latency_ms, a.bandwidth_mbps)) as srv:
        srv.publish(make_state(a.numel, a.version), version=a.version, tokens=a.version * 1000)
        emit(endpoint=srv.endpoint)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[:1] == ["publish"]:
                v = int(cmd[1])
                srv.publish(make_state(a.numel, v), version=v, tokens=v * 1000)
                emit(published=v)
            elif cmd[:1] == ["stats"]:
                emit(**srv.stats(), rss=rss_bytes())


def fetch_once(a: argparse.Namespace) -> None:
    from p2p_diloco.config import NetworkConfig
    from p2p_diloco.exchange.client import fetch

    emit(event="start")
    snap = fetch(a.endpoint, NetworkConfig(), timeout=a.timeout, secret=a.secret)
    emit(event="done", version=snap.version, nbytes=snap.nbytes)


def main() -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--numel", type=int, default=100_000)
    s.add_argument("--version", type=int, default=1)
    s.add_argument("--codec", default="fp32")
    s.add_argument("--latency-ms", type=float, default=0.0)
    s.add_argument("--bandwidth-mbps", type=float, default=None)
    s.add_argument("--secret", default=None)
    s.add_argument("--retain", type=int, default=2)
    f = sub.add_parser("fetch")
    f.add_argument("endpoint")
    f.add_argument("--secret", default=None)
    f.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args()
    serve(a) if a.cmd == "serve" else fetch_once(a)


if __name__ == "__main__":
    main()
