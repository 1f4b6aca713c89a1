"""`p2p-diloco bench transport`: the state exchange between two processes on 127.0.0.1, measured
against a bare ZeroMQ transfer of the same bytes between the same two processes in the same run.

The server process (`python -m p2p_diloco.bench.transport serve ...`) publishes `params` random
fp32 values as one tensor and serves them three ways: the protocol without emulation, the protocol
behind an emulated link (when asked), and bare ZeroMQ (the physical reference: one request, the
whole encoded buffer back as one zero-copy frame, or with `raw="stream"` a pipelined stream of
4 MiB frames that the receiver keeps). The calling process is the fetcher. Each figure is the best
of `repeat` runs after one warm-up, raw and protocol runs interleaved.

`link_utilization` is the time the emulated link needs for the payload (`bytes / rate`) over the
time the fetch gave it: `fetch_s` minus one round trip (the HELLO's trip out and the last byte's
trip back, which no protocol avoids). Any idle link time (a window below the bandwidth-delay
product, a slow start, stalls) lowers it. `emulated.bytes_per_s` is the plain end-to-end rate.
A separate fresh process measures the fetcher's peak extra memory (RSS sampled every millisecond).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from p2p_diloco.exchange.linkemu import EmulatedLink

RAW_STREAM_CHUNK, RAW_STREAM_WINDOW = 4 * 1024 * 1024, 4


FETCH_TIMEOUT_S = 60.0
"""A benchmark fetch that hears nothing for this long fails (the default is sized for a round)."""
SERVER_EXIT_S = 20.0
"""How long the serving process may take to close its servers after its stdin closes."""
MEMORY_RUN_S = 600.0
"""Limit of the fresh process that measures the fetcher's memory."""

def _serve_raw(sock: Any, view: memoryview, stop: threading.Event) -> None:
    """Bare ZeroMQ reference: `all` -> the whole buffer in one frame; `off,len` -> that slice."""
    while not stop.is_set():
        if not sock.poll(50):
            continue
        ident, req = sock.recv_multipart()
        if req == b"all":
            sock.send_multipart([ident, view], copy=False)
        else:
            off, n = map(int, req.split(b","))
            sock.send_multipart([ident, view[off : off + n]], copy=False)
    sock.close(linger=0)


def raw_fetch(endpoint: str, nbytes: int, mode: str) -> float:
    """Seconds for a bare ZeroMQ transfer of `nbytes` (the receiver keeps every byte)."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvhwm = 0
    sock.connect(endpoint)
    try:
        t0 = time.perf_counter()
        if mode == "message":
            sock.send(b"all")
            got = [sock.recv(copy=False)]
        else:
            got, off, inflight = [], 0, 0
            while len(got) * RAW_STREAM_CHUNK < nbytes:
                while inflight < RAW_STREAM_WINDOW and off < nbytes:
                    sock.send(b"%d,%d" % (off, min(RAW_STREAM_CHUNK, nbytes - off)))
                    off, inflight = off + RAW_STREAM_CHUNK, inflight + 1
                got.append(sock.recv(copy=False))
                inflight -= 1
        seconds = time.perf_counter() - t0
        if sum(len(f.buffer) for f in got) != nbytes:
            raise RuntimeError("bare transfer returned the wrong number of bytes")
        return seconds
    finally:
        sock.close(linger=0)


def serve(params: int, compression: str, latency_ms: float, bandwidth_mbps: float | None, secret: str | None) -> None:
    """Child process: publish, print the endpoints as one JSON line, serve until stdin closes."""
    import torch
    import zmq

    from p2p_diloco.config import NetworkConfig
    from p2p_diloco.core import codecs
    from p2p_diloco.exchange import payload
    from p2p_diloco.exchange.server import SnapshotServer

    torch.set_num_threads(1)
    phi = torch.randn(params, generator=torch.Generator().manual_seed(0))
    meta = {"checksum": float(codecs.roundtrip(phi, compression).double().sum())}
    servers = [SnapshotServer(config=NetworkConfig(), secret=secret)]
    if latency_ms or bandwidth_mbps:
        servers.append(SnapshotServer(secret=secret, config=NetworkConfig(),
                                      link=EmulatedLink(latency_ms, bandwidth_mbps)))
    for s in servers:  # `codec_of`: any wire codec, `sign` (a public state's update) included
        s.publish({"phi": phi}, version=1, tokens=params, meta=meta, codec_of={"phi": compression})
    _, buf = payload.pack({"phi": phi}, compression, version=1, tokens=params)
    del phi
    raw = zmq.Context.instance().socket(zmq.ROUTER)
    raw.linger = 0
    raw.sndhwm = 0
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=_serve_raw, args=(raw, memoryview(buf.numpy()), stop), daemon=True)
    thread.start()
    print(json.dumps({"plain": servers[0].endpoint, "emulated": servers[-1].endpoint if len(servers) > 1 else None,
                      "raw": f"tcp://127.0.0.1:{port}", "bytes": buf.numel()}), flush=True)
    sys.stdin.read()
    stop.set()
    thread.join(5)
    for s in servers:
        s.close()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_memory(endpoint: str, compression: str, secret: str | None) -> dict[str, Any]:
    """Child process: fetch once on a fresh heap; peak RSS above the pre-fetch baseline."""
    import gc

    import torch

    from p2p_diloco.config import NetworkConfig
    from p2p_diloco.exchange.client import Fetcher

    torch.set_num_threads(1)
    with Fetcher(endpoint, NetworkConfig(), secret=secret) as f:
        f.manifest()
        gc.collect()
        base = peak = _rss()
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss())
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        snap = f.fetch()
        done.set()
        sampler.join()
        peak = max(peak, _rss())
    return {"peak_extra_bytes": peak - base, "state_bytes": snap.manifest.state_bytes,
            "peak_window_bytes": snap.stats.peak_window_bytes, "payload_bytes": snap.nbytes,
            "maxrss_extra_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base}


def run(params: int, compression: str = "fp32", latency_ms: float = 0.0, bandwidth_mbps: float | None = None,
        repeat: int = 5, raw: str = "message", secret: str | None = None, memory: bool = True,
        log: Any = None) -> dict[str, Any]:
    """Run the benchmark (this process fetches); returns the issue's JSON object plus `details`."""
    import torch

    torch.set_num_threads(1)
    say = log or (lambda msg: None)
    env = dict(os.environ, OMP_NUM_THREADS="1", **({"P2P_DILOCO_BENCH_SECRET": secret} if secret else {}))
    server, eps = _start_server(params, compression, latency_ms, bandwidth_mbps, env)
    try:
        fetch_checked = _checked_fetch(eps["bytes"], secret)
        out, details = _plain_runs(params, eps, compression, secret, repeat, raw, fetch_checked, say)
        if eps["emulated"]:
            out["emulated"], details["emulated_s"] = _emulated_runs(eps, compression, secret, latency_ms, bandwidth_mbps,
                                                                    repeat, fetch_checked, say)
        if memory:
            details["memory"] = _memory_run(eps["plain"], compression, env, say)
        out["codec"] = codec_cost(params, compression)
        out["details"] = details
        return out
    finally:
        if server.poll() is None:
            server.stdin.close()
            try:
                server.wait(SERVER_EXIT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def codec_cost(params: int, compression: str, repeat: int = 3) -> dict[str, Any]:
    """Encoding (as a publish does, into its buffer) and decoding `params` values on one thread,
    nanoseconds per value, best of `repeat`."""
    import torch

    from p2p_diloco.core import codecs

    x = torch.randn(params, generator=torch.Generator().manual_seed(1))
    buf = torch.empty(codecs.encoded_nbytes(params, compression), dtype=torch.uint8)
    enc, dec = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        codecs.encode_into(buf, x, compression)
        t1 = time.perf_counter()
        codecs.decode(buf, params, compression)
        enc.append(t1 - t0)
        dec.append(time.perf_counter() - t1)
    return {"codec": compression, "encode_ns_per_param": min(enc) / params * 1e9,
            "decode_ns_per_param": min(dec) / params * 1e9, "bytes_per_param": buf.numel() / params}


def _start_server(params: int, compression: str, latency_ms: float, bandwidth_mbps: float | None,
                  env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, Any]]:
    """The serving process and the endpoints it printed (plain, emulated, raw) with the state's size."""
    args = [sys.executable, "-m", "p2p_diloco.bench.transport", "serve", "--params", str(params),
            "--compression", compression, "--latency-ms", str(latency_ms)]
    args += ["--bandwidth-mbps", str(bandwidth_mbps)] if bandwidth_mbps else []
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    line = server.stdout.readline()
    if not line:
        server.wait()
        raise RuntimeError("the benchmark's server process exited before serving")
    return server, json.loads(line)


def _checked_fetch(nbytes: int, secret: str | None) -> Callable[[str, Any], Any]:
    """A fetch that fails unless it returns exactly what the server published."""
    from p2p_diloco.exchange.client import fetch

    def fetch_checked(endpoint: str, link: EmulatedLink | None = None) -> Any:
        snap = fetch(endpoint, timeout=FETCH_TIMEOUT_S, secret=secret, link=link)
        if float(snap.tensors["phi"].double().sum()) != snap.meta["checksum"] or snap.nbytes != nbytes:
            raise RuntimeError("fetched state does not match what the server published")
        return snap

    return fetch_checked


def _plain_runs(params: int, eps: dict, compression: str, secret: str | None, repeat: int, raw: str, fetch_checked: Callable,
                say: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The protocol against bare ZeroMQ, interleaved, best of `repeat` after a warm-up of each."""
    nbytes = eps["bytes"]
    raw_fetch(eps["raw"], nbytes, raw)  # warm-up: connections, allocator, page cache
    fetch_checked(eps["plain"])
    raw_s, fetch_s = [], []
    for _ in range(repeat):
        raw_s.append(raw_fetch(eps["raw"], nbytes, raw))
        fetch_s.append(fetch_checked(eps["plain"]).seconds)
    say(f"bare zmq ({raw}) s: {[round(s, 4) for s in raw_s]}; protocol s: {[round(s, 4) for s in fetch_s]}")
    best, best_raw = min(fetch_s), min(raw_s)
    out = {"params": params, "bytes": nbytes, "fetch_s": best, "bytes_per_s": nbytes / best,
           "raw_zmq_bytes_per_s": nbytes / best_raw, "ratio_to_raw": best_raw / best, "emulated": None}
    return out, {"raw_s": raw_s, "fetch_s": fetch_s}


def _emulated_runs(eps: dict, compression: str, secret: str | None, latency_ms: float, bandwidth_mbps: float | None,
                   repeat: int, fetch_checked: Callable, say: Callable[[str], None]) -> tuple[dict[str, Any], list[float]]:
    """Fetches over the emulated link (the first on a cold link, not counted): the best one's figures."""
    link = EmulatedLink(latency_ms, bandwidth_mbps)
    runs = [fetch_checked(eps["emulated"], link) for _ in range(repeat + 1)]
    rate = bandwidth_mbps * 1e6 / 8 if bandwidth_mbps else None
    for i, s in enumerate(runs):
        util = s.stats.transfer_bytes_per_s / rate if rate else None
        say(f"emulated run {i}{' (cold link)' if i == 0 else ''}: {s.seconds:.3f} s, end-to-end "
            f"{s.nbytes / s.seconds / 1e6:.1f} MB/s, transfer {s.stats.transfer_bytes_per_s / 1e6:.1f} MB/s, "
            f"utilization {util if util is None else round(util, 4)}, rtt {s.stats.rtt_s * 1e3:.1f} ms, "
            f"peak window {s.stats.peak_window_bytes / 2**20:.1f} MiB, chunk {s.stats.chunk_bytes // 1024} KiB")
    b = min(runs[1:], key=lambda s: s.seconds)
    figures = {"latency_ms": latency_ms, "bandwidth_mbps": bandwidth_mbps, "bytes_per_s": eps["bytes"] / b.seconds,
               "link_utilization": b.stats.transfer_bytes_per_s / rate if rate else None}
    return figures, [s.seconds for s in runs]


def _memory_run(endpoint: str, compression: str, env: dict[str, str], say: Callable[[str], None]) -> dict[str, Any]:
    """The fetcher's peak extra memory, measured in a fresh process."""
    mem = subprocess.run([sys.executable, "-m", "p2p_diloco.bench.transport", "memory", endpoint,
                          "--compression", compression], env=env, capture_output=True, text=True, timeout=MEMORY_RUN_S)
    if mem.returncode:
        raise RuntimeError(f"memory measurement failed: {mem.stderr[-2000:]}")
    m = json.loads(mem.stdout)
    say(f"fetcher peak extra memory: {m['peak_extra_bytes'] / 2**20:.1f} MiB (state {m['state_bytes'] / 2**20:.1f} MiB"
        f" + peak window {m['peak_window_bytes'] / 2**20:.1f} MiB; ru_maxrss says {m['maxrss_extra_bytes'] / 2**20:.1f} MiB)")
    return m


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m p2p_diloco.bench.transport")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--params", type=int, required=True)
    s.add_argument("--compression", default="fp32")
    s.add_argument("--latency-ms", type=float, default=0.0)
    s.add_argument("--bandwidth-mbps", type=float, default=None)
    m = sub.add_parser("memory")
    m.add_argument("endpoint")
    m.add_argument("--compression", default="fp32")
    a = p.parse_args(argv)
    secret = os.environ.get("P2P_DILOCO_BENCH_SECRET") or None
    if a.cmd == "serve":
        serve(a.params, a.compression, a.latency_ms, a.bandwidth_mbps, secret)
    else:
        print(json.dumps(measure_memory(a.endpoint, a.compression, secret)), flush=True)


if __name__ == "__main__":
    main()
