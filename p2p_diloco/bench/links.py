"""`p2p-diloco bench links`: real islands on separate hosts whose links slow down, go down and split.

Each island is a real `join` process (`bench member` with `--latency-ms` for the emulated delay, the
tiny preset, the default settings, one torch thread) in a network namespace of its own, and the
bootstrap node in one more, all on one bridge (`bench.netns.HostNet`): every host sends through a
tbf at `FAST_RATE`, and the bench talks to no address but these hosts'. The scenarios:

- `fast`: every link fast, the baseline;
- `slow-uplink`: the last island's uplink at `SLOW_RATE` (its tbf) for the whole run;
- `drop`: the last island's link goes down for the middle of the run, then comes back: it drops
  whatever arrives on its link and every other host drops what comes from it (iptables inside
  the namespaces), so that both ways are silent, as a cable pulled mid-route, not refused;
- `partition`: the first half of the islands and the second cannot reach each other (each host
  drops what comes from the other half) for the middle of the run, then they heal. The bootstrap
  node is in neither half: both keep reaching it, as an entry point on a third network would.

"The middle of the run" (`EVENT`) is measured in the swarm's progress, not guessed in seconds: the
mean over the islands of the tokens each has trained of its budget, from their `metrics.jsonl`
rows, interpolated between rows at each island's own rate. The event starts when that passes 30%
and ends when it passes 70%; the bench notes both moments (wall-clock, as the rows' `time`), and
`fast` and `slow-uplink` note theirs the same way (nothing happens then), so every scenario's rows
split alike. A row counts in the window its `time` (its round's end) falls in.

Per island: its final eval loss (its checkpoint's anchor on the simulator's held-out batches, as
`bench attack` evaluates), and from its rows, before, during and after the event: rounds, partner
states mixed per round (a weight above 0, pushed ones too), mixes across the cut (from the islands
the event cut it off from), refusals of states of the run's islands (every island is honest here,
so each refusal is a false one), and the rounds after the event until it mixed again (`recovery`:
1 when the first round after it did), and until it mixed across the cut again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import fmean
from typing import Callable, Iterator

from p2p_diloco.bench.netns import HostNet
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.peers.launch.demo import Swarm
from p2p_diloco.peers.reports.metrics import read_metrics

SCENARIOS = ("fast", "slow-uplink", "drop", "partition")
FAST_RATE = "1000mbit"
"""Every host's uplink (bench attack's emulated 1000 Mbit/s)."""
SLOW_RATE = "500kbit"
"""The slow uplink of `slow-uplink` (0.5 Mbit/s)."""
LATENCY_MS = 100.0
"""One-way delay every island's messages get (`bench member --latency-ms`: netem does not work everywhere)."""
EVENT = (0.3, 0.7)
"""The event's window, in the swarm's progress (`progress`): the middle 40% of the run."""
WINDOWS = ("before", "during", "after")
BOOTSTRAP_PORT = 7000
POLL_S = 0.5


def rounds(run_dir: Path) -> list[dict]:
    """An island's round rows from its `metrics.jsonl` (as `bench swarm` reads them, without its imports)."""
    return [r for r in read_metrics(run_dir) if "round" in r]


def split(rows: list[dict], start: float | None, end: float | None) -> dict[str, list[dict]]:
    """An island's round rows by the window their `time` falls in: before `start`, from `start` to
    `end`, from `end` on (no `start`: the event never began, every row is before it; no `end`: it
    never ended)."""
    out: dict[str, list[dict]] = {w: [] for w in WINDOWS}
    for r in rows:
        t = r["time"]
        window = ("before" if start is None or t < start else "during" if end is None or t < end else "after")
        out[window].append(r)
    return out


def mixes(row: dict, partners: set[str] | None = None) -> int:
    """Partner states a round mixed (a weight above 0): its exchange's and those pushed to it; only
    those of `partners` when given."""
    def counts(partner: str | None, weight: float | None) -> bool:
        return bool(weight) and (partners is None or partner in partners)

    return int(counts(row.get("partner"), row.get("weight"))) + sum(
        counts(p.get("partner"), p.get("weight")) for p in row.get("pushed_in", []))


def refusals(row: dict, honest: set[str]) -> int:
    """States of `honest` islands a round refused: mid-round (`refused_from`), its exchange's own
    (`refused`, naming the reason) and pushed ones."""
    return (sum(p in honest for p in row.get("refused_from", []))
            + int(bool(row.get("refused")) and row.get("partner") in honest)
            + sum(bool(p.get("refused")) and p.get("partner") in honest for p in row.get("pushed_in", [])))


def recovery(after: list[dict], partners: set[str] | None = None) -> int | None:
    """Rounds after the event until the first that mixed (a state of `partners`, when given): 1 when
    the first round after it did; None when none did."""
    return next((k for k, r in enumerate(after, start=1) if mixes(r, partners)), None)


def figures(rows: list[dict], start: float | None, end: float | None, honest: set[str],
            cut: set[str] | None) -> dict:
    """One island's figures by window (see the module docstring); `cut`: the peer ids the event cut
    it off from (None: it cut nothing, the cross figures are left out)."""
    parts = split(rows, start, end)
    out: dict = {"rounds": {w: len(rs) for w, rs in parts.items()},
                 "mixes": {w: sum(mixes(r) for r in rs) for w, rs in parts.items()},
                 "honest_refusals": {w: sum(refusals(r, honest) for r in rs) for w, rs in parts.items()}}
    out["mixes_per_round"] = {w: round(out["mixes"][w] / n, 3) if (n := out["rounds"][w]) else None for w in WINDOWS}
    out["recovery_rounds"] = recovery(parts["after"]) if start is not None else None
    out["cross_mixes"] = {w: sum(mixes(r, cut) for r in rs) for w, rs in parts.items()} if cut else None
    out["cross_recovery_rounds"] = recovery(parts["after"], cut) if cut and start is not None else None
    return out


def progress(rows_by_island: list[list[dict]], tokens: int, round_tokens: int, now: float) -> float:
    """The swarm's progress in [0, 1]: the mean over islands of the tokens each trained of its `tokens`,
    its last row's count carried on at its own rate since (at most one round further); an island
    without a row yet counts 0."""
    shares = []
    for rows in rows_by_island:
        if not rows:
            shares.append(0.0)
            continue
        last = rows[-1]
        done = last.get("own_tokens", last.get("tokens", 0))
        rate = done / max(last.get("wall_s") or 0.0, 1e-9)
        shares.append(min(done + rate * max(0.0, now - last["time"]), done + round_tokens, tokens) / tokens)
    return fmean(shares) if shares else 0.0


def halves(islands: int) -> tuple[list[int], list[int]]:
    """`partition`'s two sides: the first `islands // 2` islands, and the rest."""
    return list(range(islands // 2)), list(range(islands // 2, islands))


def cut_off(scenario: str, k: int, islands: int) -> list[int]:
    """The islands the event cuts island `k` off from (none for `fast` and `slow-uplink`)."""
    if scenario == "drop":
        return [j for j in range(islands - 1)] if k == islands - 1 else [islands - 1]
    if scenario == "partition":
        a, b = halves(islands)
        return b if k in a else a
    return []


def deadline_s(islands: int, tokens: int, round_tokens: int) -> float:
    """How long one swarm may take, start-up and the final mix included: a minute per round for each
    island a core must carry (two 15 s rounds' worth of slack), plus 3 minutes."""
    per_core = max(1.0, islands / (os.cpu_count() or 1))
    return 180.0 + 60.0 * -(-tokens // round_tokens) * per_core


@contextmanager
def _signals(handler) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to `handler` inside the block (in the main thread only), so that
    `kill` and a closed terminal end the bench through `finally` as Ctrl+C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, old in previous.items():
            if old is not None:
                signal.signal(s, old)


def _exit_on_signal(signum: int, _frame: object) -> None:
    """The first signal ends the bench (`KeyboardInterrupt` for SIGINT); later ones are ignored, so
    that they cannot cut the clean-up short."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


class NetSwarm(Swarm):
    """The demo's `Swarm` with each process started inside a host of `net`: the bootstrap node in host
    0 at a fixed port, island k in host k + 1, listening on that host's address."""

    def __init__(self, workdir: Path, settings: dict[str, dict], net: HostNet) -> None:
        super().__init__(workdir, settings)
        self.net = net
        self._prefix: list[str] = []

    def _spawn(self, args: list[str], log_name: str, stdout=None) -> subprocess.Popen:
        return super()._spawn([*self._prefix, *args], log_name, stdout)

    def start_bootstrap_in(self, host: int, timeout: float = 60.0) -> list[str]:
        """The bootstrap node in `host`; returns its addresses (what islands pass to `--bootstrap`)."""
        addr_file = self.workdir / "bootstrap.addr"
        self._prefix = self.net.exec_prefix(host)
        proc = self._spawn([sys.executable, "-m", "p2p_diloco", "bootstrap", "--host", self.net.address(host),
                            "--port", str(BOOTSTRAP_PORT), "--identity", str(self.workdir / "bootstrap.key"),
                            "--addr-file", str(addr_file)], "bootstrap.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if addr_file.exists() and addr_file.read_text().strip():
                self.bootstrap_addr = addr_file.read_text().split()
                return self.bootstrap_addr
            time.sleep(0.2)
        raise RuntimeError(f"the bootstrap node did not start; see {self.workdir / 'bootstrap.log'}")

    def start_island_in(self, host: int, name: str, args: list[str]) -> subprocess.Popen:
        """A `bench member` island in `host`, with the emulated delay, listening on the host's address."""
        self._prefix = self.net.exec_prefix(host)
        return self.start_island(name, [*args, "--host", self.net.address(host)],
                                 ("bench", "member", "--latency-ms", str(LATENCY_MS)))


def _event(net: HostNet, scenario: str, islands: int, iptables: str) -> list[int]:
    """Starts `drop`'s or `partition`'s cut (hosts: island k is host k + 1); returns the hosts filtered."""
    if scenario == "drop":
        gone = islands  # the last island's host
        net.drop_all(gone, iptables)
        for h in range(islands + 1):
            if h != gone:
                net.drop_from(h, [gone], iptables)
        return list(range(islands + 1))
    if scenario == "partition":
        a, b = ([k + 1 for k in side] for side in halves(islands))
        for side, other in ((a, b), (b, a)):
            for h in side:
                net.drop_from(h, other, iptables)
        return a + b
    return []


def _run(workdir: Path, scenario: str, islands: int, tokens: int, iptables: str,
         log: Callable[[str], None] = lambda _: None) -> dict:
    """One swarm of `scenario` to its end (or its deadline): the event's moments, the islands' exit
    codes and whether the deadline stopped it. Every process is stopped and every namespace deleted
    however it ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    round_tokens = DiLoCoConfig.local_steps * TrainConfig.batch_size * ModelConfig().resolved()["block_size"]
    limit = deadline_s(islands, tokens, round_tokens)
    names = [f"island-{k}" for k in range(islands)]
    args = ["--run-id", "links", "--max-tokens", str(tokens), "--wait-for", str(islands), "--quiet"]
    run: dict = {"scenario": scenario, "workdir": str(workdir), "deadline_s": limit, "timed_out": False,
                 "window": {"start": None, "end": None, "applied": scenario in ("drop", "partition")},
                 "dropped_packets": None}
    started = time.monotonic()
    net, swarm, filtered = None, None, []
    try:
        net = HostNet(islands + 1, rate=FAST_RATE)  # (deletes what it made itself if it fails half-way)
        swarm = NetSwarm(workdir, {"island": {"eval_every": 5}}, net)
        if scenario == "slow-uplink":
            net.set_rate(islands, SLOW_RATE)
        swarm.start_bootstrap_in(0)
        procs = [swarm.start_island_in(k + 1, n, args) for k, n in enumerate(names)]
        window = run["window"]
        while any(p.poll() is None for p in procs):
            if time.monotonic() - started > limit:
                run["timed_out"] = True
                break
            share = progress([rounds(workdir / n) for n in names], tokens, round_tokens, time.time())
            if window["start"] is None and share >= EVENT[0]:
                filtered = _event(net, scenario, islands, iptables)
                window["start"] = time.time()
                log(f"{scenario}: the event's window opens at {share:.0%} of the run, "
                    f"{time.monotonic() - started:.0f} s in" + ("" if filtered else " (nothing happens then)"))
            elif window["start"] is not None and window["end"] is None and share >= EVENT[1]:
                run["dropped_packets"] = sum(net.clear(h, iptables) for h in filtered) if filtered else None
                filtered, window["end"] = [], time.time()
                log(f"{scenario}: the event's window closes at {share:.0%}, {time.monotonic() - started:.0f} s in")
            time.sleep(POLL_S)
    finally:
        with _signals(signal.SIG_IGN):  # a second Ctrl+C cannot leave a process or a namespace behind
            try:
                if swarm is not None:
                    swarm.stop()
            finally:
                if net is not None:
                    net.close()
    if run["window"]["start"] is not None and run["window"]["end"] is None:
        run["window"]["end"] = time.time()  # (the swarm ended first: the event lasted to its end)
    run["exit_codes"] = [p.returncode for p in swarm.procs[1:]]
    run["wall_s"] = round(time.monotonic() - started, 1)
    for n, code in zip(names, run["exit_codes"]):
        if code != 0 and not run["timed_out"]:
            log(f"{scenario}: {n} exited with {code}; see {workdir / (n + '.log')}")
    log(f"{scenario}: done in {run['wall_s']:.0f} s, exit codes {run['exit_codes']}"
        + (" (stopped at the deadline)" if run["timed_out"] else ""))
    return run


def _report(run: dict, islands: int, evaluate) -> dict:
    """A finished swarm's per-island figures (see the module docstring)."""
    workdir, scenario = Path(run["workdir"]), run["scenario"]
    names = [f"island-{k}" for k in range(islands)]
    ids = []
    for n in names:
        info = workdir / n / "island.json"
        ids.append(json.loads(info.read_text())["peer_id"] if info.exists() else None)
    honest = {i for i in ids if i}
    affected = set(range(islands // 2)) if scenario == "partition" else (
        {islands - 1} if scenario in ("slow-uplink", "drop") else set())
    start, end = run["window"]["start"], run["window"]["end"]
    out = []
    for k, n in enumerate(names):
        cut = {ids[j] for j in cut_off(scenario, k, islands) if ids[j]} or None
        out.append({"name": n, "peer_id": ids[k], "affected": k in affected, "exit_code": run["exit_codes"][k],
                    "eval_loss": evaluate(workdir / n),
                    **figures(rounds(workdir / n), start, end, honest, cut)})
    return {**run, "islands": out}


def run_bench_links(scenarios: tuple[str, ...] = SCENARIOS, islands: int = 4, tokens: int = 368_640, runs: int = 1,
                    workdir: Path | None = None, iptables: str = "iptables",
                    log: Callable[[str], None] = lambda _: None) -> dict:
    """`runs` swarms of each scenario, run by run (so that a change of the machine's load falls on every
    scenario alike); `iptables`: the binary that filters (`bench.netns.iptables_binary`); `log`: where
    a line goes as each swarm starts, its event begins and ends, and it ends."""
    import tempfile

    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.peers.state import checkpoint
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-links-"))
    workdir.mkdir(parents=True, exist_ok=True)
    simulation = Simulation(SimConfig(islands=islands), ModelConfig(), TrainConfig(), DiLoCoConfig(), load_corpus())

    def evaluate(run_dir: Path) -> float | None:
        path = checkpoint.latest(run_dir / "checkpoints") if (run_dir / "checkpoints").exists() else None
        return None if path is None else simulation.evaluate_vector(checkpoint.load(path).tensors[checkpoint.ANCHOR])

    started = time.monotonic()
    found: dict[str, list[dict]] = {s: [] for s in scenarios}
    with _signals(_exit_on_signal):
        for k in range(runs):
            for s in scenarios:
                log(f"{s}: run {k}, {islands} islands in {workdir / f'{s}-{k}'}")
                run = _run(workdir / f"{s}-{k}", s, islands, tokens, iptables, log)
                found[s].append(_report(run, islands, evaluate))
    a, b = halves(islands)
    out: dict = {"islands": islands, "tokens_per_island": tokens, "runs": runs, "latency_ms": LATENCY_MS,
                 "fast_rate": FAST_RATE, "slow_rate": SLOW_RATE, "event_progress": list(EVENT),
                 "affected_island": f"island-{islands - 1}",
                 "partition": [[f"island-{k}" for k in a], [f"island-{k}" for k in b]],
                 "bootstrap": "its own host, in neither half of the partition: reachable from both",
                 "eval_loss_from": "the final checkpoint's anchor on the simulator's held-out batches",
                 "scenarios": {}}
    for s, rs in found.items():
        isl = [i for r in rs for i in r["islands"]]
        losses = [i["eval_loss"] for i in isl if i["eval_loss"] is not None]
        per_round = {w: round(sum(i["mixes"][w] for i in isl) / n, 3) if (n := sum(i["rounds"][w] for i in isl)) else None
                     for w in WINDOWS}
        recovered = [i["recovery_rounds"] for i in isl]
        out["scenarios"][s] = {"mean_eval_loss": fmean(losses) if losses else None, "mixes_per_round": per_round,
                               "honest_refusals": sum(sum(i["honest_refusals"].values()) for i in isl),
                               "recovery_rounds_max": None if None in recovered or not recovered else max(recovered),
                               "timed_out": sum(r["timed_out"] for r in rs), "runs": rs}
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["workdir"] = str(workdir)
    return out


def table(out: dict) -> list[str]:
    """`bench links`' human output: one line per island of each run, one per scenario with its means."""
    def fmt(x: float | int | None, spec: str = "") -> str:
        return "-" if x is None else format(x, spec)

    lines = [f"{out['islands']} islands x {out['tokens_per_island']:,} tokens, {out['runs']} run(s); links "
             f"{out['fast_rate']}, {out['latency_ms']:g} ms; event from {EVENT[0]:.0%} to {EVENT[1]:.0%} of the "
             f"run on {out['affected_island']} (partition {'|'.join(','.join(h) for h in out['partition'])}, "
             f"bootstrap reachable from both)",
             f"{'scenario':<12} {'run':>3} {'island':<9} {'loss':>7}  {'mixes/round b/d/a':<20} {'cross b/d/a':<12} "
             f"{'refused':>7} {'recovery':>8} {'cross':>5}"]
    for s, sc in out["scenarios"].items():
        for k, r in enumerate(sc["runs"]):
            for i in r["islands"]:
                m = "/".join(fmt(i["mixes_per_round"][w], ".2f") for w in WINDOWS)
                c = "/".join(str(i["cross_mixes"][w]) for w in WINDOWS) if i["cross_mixes"] else "-"
                lines.append(f"{s:<12} {k:>3} {i['name'] + ('*' if i['affected'] else ''):<9} "
                             f"{fmt(i['eval_loss'], '.4f'):>7}  {m:<20} {c:<12} "
                             f"{sum(i['honest_refusals'].values()):>7} {fmt(i['recovery_rounds']):>8} "
                             f"{fmt(i['cross_recovery_rounds']):>5}"
                             + (f"  exited {i['exit_code']}" if i.get("exit_code") else ""))
        lines.append(f"{s:<12} mean eval loss {fmt(sc['mean_eval_loss'], '.4f')}, mixes per round "
                     f"{'/'.join(fmt(sc['mixes_per_round'][w], '.2f') for w in WINDOWS)}, honest refusals "
                     f"{sc['honest_refusals']}, recovery within {fmt(sc['recovery_rounds_max'])} round(s)"
                     + (f", {sc['timed_out']} run(s) stopped at the deadline" if sc["timed_out"] else ""))
    return lines
