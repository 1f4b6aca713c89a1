"""`p2p-diloco bench discovery`: N members joining one bootstrap node at once, discovery only.

Each member is a `lightmember` process (it joins, announces a record and watches the run; it
does not train), all started together against one `p2p-diloco bootstrap` node. Measured:

- each member's start (from the spawn until its record was announced) and the time until its view
  held all N members (`None` when the deadline came first);
- each member's memory once all have started: the proportional set size (PSS, shared pages split
  among the processes that share them) of its whole process tree, the DHT process and libp2p
  daemon included;
- the bootstrap node: the peers it saw join (the DHT routing table's joins, or the rendezvous's
  islands, from its log) and the CPU seconds of its process tree.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from p2p_diloco import procs
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.peers.launch.demo import Swarm

KINDS = ("dht", "zmq")
JOINED = {"dht": re.compile(r"DHT peer (\S+) joined"), "zmq": re.compile(r"rendezvous: island (\S+) joined")}
"""The bootstrap node's log line for a peer that joined, by kind."""
LOG_LAG_S = 5.0
"""How long the bootstrap node's log may lag behind its peers (it looks at its routing table every 2 s)."""
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def run_bench_discovery(members: int, kind: str, deadline_s: float = 300.0, workdir: Path | None = None,
                        log=lambda _msg: None) -> dict:
    """Start a bootstrap node, then `members` members at once; wait until every one saw all (or
    `deadline_s` passed since the spawn) and report the figures of the module docstring."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    with tempfile.TemporaryDirectory(prefix="p2p-diloco-discovery-") as tmp:
        where = Path(workdir) if workdir is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        swarm = _Members(where)
        try:
            addresses = swarm.start_bootstrap(60.0, "--discovery", "auto" if kind == "dht" else "zmq")
            entry = next(a for a in addresses if a.startswith("/" if kind == "dht" else "tcp://"))
            boot_cpu = _tree_cpu_s(swarm.procs[0].pid)
            t0 = time.time()
            procs = [swarm.member(k, entry, kind) for k in range(members)]
            log(f"{members} members started against {entry}")
            result = swarm.wait(procs, t0, deadline_s, log)
            cpu_s = _tree_cpu_s(swarm.procs[0].pid) - boot_cpu
            until = time.monotonic() + LOG_LAG_S  # the node logs its routing table's joins every 2 s
            while (joined := _joined(where / "bootstrap.log", kind)) < members and time.monotonic() < until:
                time.sleep(0.2)
            result["bootstrap"] = {"peers_joined": joined, "cpu_s": cpu_s}
        finally:
            swarm.stop()
    return {"members": members, "kind": kind, "deadline_s": deadline_s, **result}


class _Members(Swarm):
    """The bootstrap node and the members as child processes (each in its own session), reaped by `stop`."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self._seen: dict[int, tuple[list[dict], int]] = {}
        """Per member: its events read so far, and how far into its file they reach."""

    def member(self, k: int, entry: str, kind: str):
        """Member `k`, joining through `entry` with an island's discovery settings; its events go to
        `member-k.jsonl`."""
        d = DiscoveryConfig()
        return self._spawn([sys.executable, "-m", "p2p_diloco.bench.lightmember", "--bootstrap", entry, "--run-id", "bench",
                            "--discovery", kind, "--endpoint-port", str(20000 + k), "--bump", "5",
                            "--expiry", str(d.expiry), "--refresh", str(d.refresh), "--poll", str(d.poll),
                            "--connect-timeout", str(d.connect_timeout)],
                           f"member-{k}.log", stdout=open(self.workdir / f"member-{k}.jsonl", "w"))

    def _events(self, k: int) -> list[dict]:
        """Member `k`'s events so far: the lines of `member-k.jsonl` it has finished, each read once."""
        events, start = self._seen.setdefault(k, ([], 0))
        with open(self.workdir / f"member-{k}.jsonl", "rb") as f:
            f.seek(start)
            data = f.read()
        done = data.rfind(b"\n") + 1  # (a line still being written waits for the next read)
        events += [json.loads(line) for line in data[:done].splitlines() if line.strip()]
        self._seen[k] = (events, start + done)
        return events

    def _first(self, events: list[dict], what: str, pred=lambda e: True) -> dict | None:
        return next((e for e in events if e["event"] == what and pred(e)), None)

    def wait(self, procs: list, t0: float, deadline_s: float, log) -> dict:
        """Wait until every member's view holds all of them (or the deadline); the figures."""
        n = len(procs)
        memory: list[int] | None = None
        ids: set[str] = set()
        while True:
            events = [self._events(k) for k in range(n)]
            ready = [self._first(e, "ready") for e in events]
            if memory is None and all(ready):
                tree = _children()
                memory = [_tree_pss(p.pid, tree) for p in procs]  # all started: each one's tree at its size
                ids = {r["peer_id"] for r in ready}
                log(f"all {n} started after {max(r['t'] for r in ready) - t0:.1f} s")
            saw = [self._first(e, "view", lambda v: set(v["peers"]) >= ids) if ids else None for e in events]
            if all(saw) or time.time() - t0 >= deadline_s:
                break
            time.sleep(0.5)
        views = [[e for e in ev if e["event"] == "view"] for ev in events]
        seen = [len(v[-1]["peers"]) if v else 0 for v in views]
        start_s = [r["t"] - t0 if r else None for r in ready]
        all_s = [s["t"] - t0 if s else None for s in saw]
        done = [s for s in all_s if s is not None]
        return {"start_s": start_s, "saw_all_s": all_s, "saw_all": len(done), "seen_at_end": seen,
                "slowest_start_s": max((s for s in start_s if s is not None), default=None),
                "all_saw_all_s": max(done) if len(done) == n else None,
                "median_seen_at_end": statistics.median(seen),
                "memory_bytes": memory, "memory_mean_bytes": statistics.mean(memory) if memory else None,
                "died": sum(1 for p in procs if p.poll() is not None)}


def _joined(log_file: Path, kind: str) -> int:
    """Distinct peers the bootstrap node's log says joined."""
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    return len(set(JOINED[kind].findall(text)))


def _children() -> dict[int, list[int]]:
    """Each live process's children."""
    children: dict[int, list[int]] = {}
    for p in procs.processes():
        children.setdefault(p.ppid, []).append(p.pid)
    return children


def _tree(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """`pid` and its descendants (`children`: a map read before, else read now)."""
    children = _children() if children is None else children
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _tree_pss(pid: int, children: dict[int, list[int]]) -> int:
    """Proportional set size of `pid`'s process tree, in bytes (RSS where smaps_rollup is missing)."""
    total = 0
    for p in _tree(pid, children):
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+) kB", text, re.M).group(1)) * 1024
        except (OSError, AttributeError):
            try:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            except OSError:
                continue
    return total


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of `pid`'s live process tree."""
    total = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / TICKS


def table(out: dict) -> list[str]:
    """The figures as the lines `bench discovery` prints."""
    mb = out["memory_mean_bytes"]
    every = out["all_saw_all_s"]
    return [f"{out['members']} members over {out['kind']}, one bootstrap node, deadline {out['deadline_s']:g} s",
            f"  every member saw all after: {f'{every:.1f} s' if every is not None else 'not within the deadline'} "
            f"({out['saw_all']} of {out['members']} did; median view at the end {out['median_seen_at_end']:g})",
            f"  slowest member's start:     {out['slowest_start_s']:.1f} s" if out["slowest_start_s"] is not None
            else "  slowest member's start:     none started",
            f"  memory per member (PSS):    {mb / 2**20:.0f} MiB" if mb else "  memory per member:          not measured",
            f"  bootstrap node:             {out['bootstrap']['peers_joined']} peers joined, "
            f"{out['bootstrap']['cpu_s']:.1f} CPU s",
            f"  members that died:          {out['died']}"]
