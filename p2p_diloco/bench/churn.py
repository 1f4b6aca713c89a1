"""`p2p-diloco bench churn`: a swarm of real islands that lives through kills, resumes and late joiners.

`islands` island processes (`bench member`: `join` with an emulated WAN link, the tiny preset, one
torch thread each) train the same tokens each, twice per run: once all started together and left
alone (`steady`), once with churn (`churn`): a quarter of them are killed with SIGKILL (the island's
own process, as `kill -9` does: what it started must not outlive it) at a random point of a random
round and started again with `--resume` a few seconds later, and `late` of them join from nothing
a third of the way in, catching up from the freshest members. Every island checkpoints each round,
in both swarms.

What it reports: each island's eval loss (its last checkpoint's anchor on the simulator's held-out
batches, as `bench swarm` evaluates) against the steady swarm's mean (`bench.attack.judged`: the
mean, the worst island, the runs' spread); the mixes per round; the fetches each island served per
round (counted from every island's rows, which name the partner of each exchange), the most loaded
against the mean; partial mixes (a whole state mixed that moved at least a chunk fewer bytes than the median whole
state of its run); each late joiner's start (from its island's construction to its first inner step:
discovery, the download of the freshest states, adopting one) and the version of its first round
against the swarm's then;
the processes an island's session still held after it ended (processes left behind).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, median

from p2p_diloco import procs
from p2p_diloco.bench.attack import judged
from p2p_diloco.bench.swarm import final_losses, rounds
from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, ModelConfig, NetworkConfig, TrainConfig
from p2p_diloco.peers.launch.demo import Swarm

RESTART_AFTER_S = 5.0
"""Seconds between an island's kill and its start again."""
SETTINGS = {"island": {"checkpoint_every": 1, "eval_every": 5}}
"""Config sections every island of both swarms gets: a checkpoint each round, so that a kill costs
at most the round under way."""


def round_tokens(local_steps: int = DiLoCoConfig.local_steps) -> int:
    """Tokens of one round of H steps of the default batch of sequences."""
    return local_steps * TrainConfig().batch_size * ModelConfig().resolved()["block_size"]


@dataclass(frozen=True)
class Schedule:
    """Who is killed after which of its rounds (and how far into the next, as a share of a round),
    and who joins late, at which round of the swarm's."""

    kills: dict[str, tuple[int, float]]
    late: tuple[str, ...]
    late_at: int

    @classmethod
    def draw(cls, names: list[str], rounds_each: int, kills: int, late: int, seed: int) -> Schedule:
        rng = random.Random(seed)
        late_names = tuple(names[len(names) - late:])
        victims = rng.sample([n for n in names if n not in late_names], kills)
        return cls({n: (rng.randint(1, max(1, rounds_each - 2)), rng.random()) for n in victims}, late_names,
                   max(1, rounds_each // 3))


@dataclass
class Life:
    """One process of an island: it ran from `started`, under `peer_id`; `killed_at` if it was killed."""

    name: str
    proc: subprocess.Popen
    started: float
    peer_id: str | None = None
    killed_at: float | None = None
    rows_at_kill: int = 0


def session_processes(sessions: set[int]) -> list[str]:
    """The live processes (not zombies) of these sessions: `pid command` each."""
    return [f"{p.pid} {procs.command(p.pid)[:120]}" for p in procs.processes()
            if p.session in sessions and p.state != "Z"]


def partial_mixes(rows: list[dict]) -> int:
    """Whole states mixed that moved a chunk (`NetworkConfig.min_chunk_bytes`) or more below the median
    whole state of `rows` (headers vary by a few hundred bytes; a state cut short lacks chunks)."""
    sizes = [r["bytes_in"] for r in rows if r.get("weight") and r.get("fetched") == "state" and r.get("bytes_in")]
    if not sizes:
        return 0
    whole = median(sizes)
    return sum(1 for s in sizes if s <= whole - NetworkConfig.min_chunk_bytes)


@dataclass
class SwarmRun:
    """One swarm of the bench, started and watched until every island's last life ended."""

    workdir: Path
    names: list[str]
    args: list[str]
    entry: tuple[str, ...]
    schedule: Schedule | None = None
    log: Callable[[str], None] | None = None
    lives: list[Life] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)
    """What the islands' sessions still held after they ended (`_left_behind`)."""
    swarm: Swarm | None = None

    def _start(self, name: str, extra: list[str], logs: str | None = None) -> None:
        assert self.swarm is not None
        self.lives.append(Life(name, self.swarm.start_island(name, [*self.args, *extra], self.entry, logs), time.time()))

    def _rows(self, name: str) -> int:
        path = self.workdir / name / "metrics.jsonl"
        return path.read_text().count('"round"') if path.exists() else 0

    def run(self, timeout_s: float) -> None:
        self.swarm = Swarm(self.workdir, SETTINGS)
        s = self.schedule
        late = s.late if s else ()
        try:
            self.swarm.start_bootstrap()
            for n in self.names:
                if n not in late:
                    self._start(n, ["--wait-for", str(len(self.names) - len(late))])
            deadline = time.monotonic() + timeout_s
            while any(life.proc.poll() is None for life in self.current()) or self._pending():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the swarm in {self.workdir} did not finish within {timeout_s:.0f} s")
                self._watch()
                time.sleep(0.25)
            self._watch()
            self.left_behind = self._left_behind()
        finally:
            self.swarm.stop()

    def current(self) -> list[Life]:
        last = {life.name: life for life in self.lives}
        return list(last.values())

    def _pending(self) -> bool:
        """Late joiners not started yet, or killed islands not started again."""
        started = {life.name for life in self.lives}
        s = self.schedule
        return bool(s) and (any(n not in started for n in s.late) or any(l.killed_at for l in self.current()))

    def _watch(self) -> None:
        """Read who started under which peer id; start late joiners; kill and start again on schedule."""
        for life in self.lives:
            ident = self.workdir / life.name / "island.json"
            if life.peer_id is None and ident.exists() and ident.stat().st_mtime >= life.started - 1:
                try:
                    life.peer_id = json.loads(ident.read_text())["peer_id"]
                except (ValueError, KeyError):
                    pass
        s = self.schedule
        if s is None:
            return
        now, started = time.time(), {life.name for life in self.lives}
        if any(n not in started for n in s.late) and max((self._rows(n) for n in started), default=0) >= s.late_at:
            for n in s.late:
                self._say(f"{n} joins late")
                self._start(n, ["--wait-for", "1"])
        for life in self.current():
            if life.killed_at is not None:
                if now - life.killed_at >= RESTART_AFTER_S:
                    self._say(f"{life.name} starts again with --resume")
                    self._start(life.name, ["--resume", "--wait-for", "1"], logs=f"{life.name}.{self._lives(life.name)}")
            elif life.name in s.kills and self._lives(life.name) == 1 and life.proc.poll() is None:
                after, share = s.kills[life.name]
                rows = self._rows(life.name)
                if rows >= after + 1 or (rows == after and self._into_round(life.name) >= share):
                    life.proc.send_signal(signal.SIGKILL)
                    life.proc.wait()
                    life.killed_at, life.rows_at_kill = now, rows
                    self._say(f"{life.name} killed with SIGKILL after {rows} rounds")

    def _lives(self, name: str) -> int:
        return sum(life.name == name for life in self.lives)

    def _into_round(self, name: str) -> float:
        """How far the island is into its round under way, as a share of its rounds so far."""
        rows = rounds(self.workdir / name)
        if not rows:
            return 0.0
        per_round = rows[-1]["wall_s"] / len(rows)
        return (time.time() - rows[-1]["time"]) / max(per_round, 1e-6)

    def _left_behind(self) -> list[str]:
        """What the islands' sessions still hold a while after every island ended (a process started
        in its own session keeps it: a DHT process or libp2p daemon an island left)."""
        sessions = {life.proc.pid for life in self.lives}
        deadline = time.monotonic() + 15.0
        while (left := session_processes(sessions)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def _say(self, msg: str) -> None:
        if self.log:
            self.log(f"[{self.workdir.name}] {msg}")


def _summary(workdir: Path, logs: str) -> dict:
    lines = (workdir / f"{logs}.json").read_text().strip().splitlines() if (workdir / f"{logs}.json").exists() else []
    return json.loads(lines[-1]) if lines else {}


def figures(run: SwarmRun) -> dict:
    """One swarm's figures from its islands' rows (see the module docstring)."""
    rows = {n: rounds(run.workdir / n) for n in run.names}
    name_of = {life.peer_id: life.name for life in run.lives if life.peer_id}
    every = [r for n in run.names for r in rows[n]]
    served = Counter(name_of.get(r["partner"]) for r in every if r.get("partner"))
    per_round = {n: round(served.get(n, 0) / max(1, len(rows[n])), 3) for n in run.names}
    mean = fmean(per_round.values())
    out = {"rounds": {n: len(rows[n]) for n in run.names},
           "mixes_per_round": round(sum(1 for r in every if r.get("weight")) / max(1, len(every)), 3),
           "served_per_round": per_round, "most_served_to_mean": round(max(per_round.values()) / mean, 3) if mean else None,
           "partial_mixes": partial_mixes(every),
           "refused": sum(len(r.get("refused_from", [])) + bool(r.get("refused")) for r in every),
           "left_behind": run.left_behind}
    if run.schedule is None:
        return out
    out["kills"] = [{"island": life.name, "after_rounds": life.rows_at_kill} for life in run.lives if life.killed_at]
    out["late_joiners"] = []
    for n in run.schedule.late:
        first = rows[n][0] if rows[n] else None
        swarm = max((r["version"] for m in run.names if m != n for r in rows[m] if first and r["time"] <= first["time"]),
                    default=None)
        spent = _summary(run.workdir, n).get("spent", {})
        out["late_joiners"].append({"island": n, "start_s": spent.get("startup"),
                                    "first_round_version": first["version"] if first else None,
                                    "swarm_version_then": swarm})
    return out


def run_bench_churn(islands: int = 16, tokens: int | None = None, kills: int | None = None, late: int = 2,
                    runs: int = 1, seed: int = 0, local_steps: int = DiLoCoConfig.local_steps,
                    discovery: str = DiscoveryConfig.discovery,
                    latency_ms: float = 100.0, bandwidth_mbps: float = 1000.0, workdir: Path | None = None,
                    timeout_s: float = 3600.0, log: Callable[[str], None] | None = None) -> dict:
    """`runs` steady swarms and as many with churn, run by run (see the module docstring); `tokens`:
    each island's (default 8 rounds of `local_steps`); `kills`: islands killed and resumed (default a quarter);
    `discovery`: how the islands find each other (`join --discovery`)."""
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    kills = islands // 4 if kills is None else kills
    if kills + late > islands - 2:
        raise ValueError(f"{kills} killed and {late} late leave fewer than 2 of {islands} islands that start and stay")
    per_round = round_tokens(local_steps)
    tokens = tokens or 8 * per_round
    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-churn-"))
    names = [f"island-{i}" for i in range(islands)]
    args = ["--run-id", "churn", "--max-tokens", str(tokens), "-H", str(local_steps), "--discovery", discovery, "--quiet"]
    entry = ("bench", "member", "--latency-ms", str(latency_ms), "--bandwidth-mbps", str(bandwidth_mbps))
    simulation = Simulation(SimConfig(islands=islands), ModelConfig(), TrainConfig(), DiLoCoConfig(), load_corpus())
    started = time.monotonic()
    done: dict[str, list[tuple[list[float], dict]]] = {"steady": [], "churn": []}
    for k in range(runs):
        for kind in done:
            schedule = Schedule.draw(names, max(1, tokens // per_round), kills, late, seed + k) \
                if kind == "churn" else None
            run = SwarmRun(workdir / f"{kind}-{k}", names, args, entry, schedule, log=log)
            run.workdir.mkdir(parents=True, exist_ok=True)
            run.run(timeout_s)
            losses = final_losses(simulation, run.workdir, names)
            done[kind].append((losses, figures(run)))
    steady_mean = fmean(fmean(losses) for losses, _ in done["steady"])
    out = {"islands": islands, "tokens_per_island": tokens, "local_steps": local_steps, "kills": kills, "late": late,
           "runs": runs, "seed": seed, "discovery": discovery,
           "latency_ms": latency_ms, "bandwidth_mbps": bandwidth_mbps, "steady_mean": steady_mean,
           "simulator": "not compared: the simulator has no schedule of kills, resumes and late joiners"}
    for kind, found in done.items():
        j = judged([losses for losses, _ in found], steady_mean)
        out[kind] = {"eval_loss": [losses for losses, _ in found], "ratio_to_steady_mean": j["ratio_to_clean_mean"],
                     "worst_ratio_to_steady_mean": j["worst_ratio_to_clean_mean"], "spread": j["spread"],
                     "per_run": [figs for _, figs in found]}
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["workdir"] = str(workdir)
    return out


def table(out: dict) -> list[str]:
    """The figures as a few lines of text."""
    lines = [f"{out['islands']} islands, {out['tokens_per_island']:,} tokens each, {out['kills']} killed and resumed, "
             f"{out['late']} late, {out['runs']} run(s); steady mean eval loss {out['steady_mean']:.4f}"]
    for kind in ("steady", "churn"):
        k = out[kind]
        runs = k["per_run"]
        lines.append(f"{kind:7s} mean/steady {k['ratio_to_steady_mean']:.4f}  worst/steady "
                     f"{k['worst_ratio_to_steady_mean']:.4f}  mixes/round {fmean(r['mixes_per_round'] for r in runs):.3f}  "
                     f"most served/mean {max(r['most_served_to_mean'] or 0 for r in runs):.2f}  partial mixes "
                     f"{sum(r['partial_mixes'] for r in runs)}  left behind {sum(len(r['left_behind']) for r in runs)}")
    for r in out["churn"]["per_run"]:
        for j in r["late_joiners"]:
            lines.append(f"late joiner {j['island']}: started in {j['start_s']} s, first round at version "
                         f"{j['first_round_version']} (the swarm's: {j['swarm_version_then']})")
    return lines
