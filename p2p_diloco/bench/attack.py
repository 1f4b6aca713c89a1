"""`p2p-diloco bench attack`: honest islands with one hostile member among them, as processes.

For each kind of poison (`bench/member.py`: NaN, weights x1e6, a random state, another run's
state) the swarm runs with `honest` honest islands and one hostile island (a test double that
trains honestly and publishes the poison), all real `join` processes on loopback with the
default settings and an emulated WAN link; once more without the hostile island, a bystander
island training alone in another run taking its place on the machine (the honest islands share
the CPU with as many processes in every run, so only the hostile member differs). Every honest
island trains the same tokens in every run. The figures: each honest island's final eval loss
(its anchor on the simulator's held-out batches, as `bench swarm` evaluates) against the run
without the hostile island, and how many of the hostile island's states the honest ones refused
and mixed (from their `metrics.jsonl`: one row per round, naming the partner of its exchange and
the partners refused before it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from p2p_diloco.bench.swarm import rounds
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.peers import checkpoint
from p2p_diloco.peers.demo import Swarm
from p2p_diloco.choices import POISONS as KINDS

TOKENS_PER_ISLAND = 368_640
"""What each island of `bench swarm`'s default run trains (1.5M tokens over 4 islands, whole rounds)."""


def _run(workdir: Path, honest: int, poison: str | None, tokens: int, latency_ms: float,
         bandwidth_mbps: float) -> tuple[list[str], str | None]:
    """One swarm to the end; returns the honest islands' names and the hostile island's peer id."""
    workdir.mkdir(parents=True, exist_ok=True)
    swarm = Swarm(workdir, {"island": {"eval_every": 5}})
    names = [f"honest-{i}" for i in range(honest)]
    size = honest + (poison is not None)
    args = ["--run-id", "attack", "--max-tokens", str(tokens), "--wait-for", str(size), "--quiet"]
    member = ("bench", "member", "--latency-ms", str(latency_ms), "--bandwidth-mbps", str(bandwidth_mbps))
    try:
        swarm.start_bootstrap()
        procs = [swarm.start_island(n, args, member) for n in names]
        if poison is not None:
            procs.append(swarm.start_island("hostile", [*args, "--poison", poison], member))
        else:  # the same load on the machine: a fourth island that trains alone, in another run
            procs.append(swarm.start_island("bystander", [*args, "--run-id", "attack-bystander", "--wait-for", "1"],
                                            member))
        for p in procs:
            p.wait()
    finally:
        swarm.stop()
    hostile = None
    if poison is not None:
        hostile = json.loads((workdir / "hostile" / "island.json").read_text())["peer_id"]
    return names, hostile


def run_bench_attack(kinds: tuple[str, ...] = KINDS, honest: int = 3, tokens: int = TOKENS_PER_ISLAND,
                     latency_ms: float = 100.0, bandwidth_mbps: float = 1000.0, workdir: Path | None = None) -> dict:
    """The swarm without a hostile island, then with one of each kind; see the module docstring."""
    import tempfile

    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-attack-"))
    simulation = Simulation(SimConfig(islands=honest), ModelConfig(), TrainConfig(), DiLoCoConfig(), load_corpus())

    def losses(run_dir: Path, names: list[str]) -> list[float]:
        return [simulation.evaluate_vector(checkpoint.load(checkpoint.latest(run_dir / n / "checkpoints"))
                                           .tensors[checkpoint.ANCHOR]) for n in names]

    started = time.monotonic()
    names, _ = _run(workdir / "clean", honest, None, tokens, latency_ms, bandwidth_mbps)
    clean = losses(workdir / "clean", names)
    out = {"honest": honest, "tokens_per_island": tokens, "clean_eval_loss": clean, "attacks": {}}
    for kind in kinds:
        run_dir = workdir / kind
        names, hostile = _run(run_dir, honest, kind, tokens, latency_ms, bandwidth_mbps)
        attacked = losses(run_dir, names)
        rows = [r for n in names for r in rounds(run_dir / n)]
        refused_mid_round = sum(r.get("refused_from", []).count(hostile) for r in rows)
        rows = [r for r in rows if r.get("partner") == hostile]
        out["attacks"][kind] = {
            "eval_loss": attacked, "ratio_to_clean": [a / c for a, c in zip(attacked, clean)],
            "worst_ratio_to_clean": max(a / c for a, c in zip(attacked, clean)),
            "hostile_states_refused": refused_mid_round + sum(1 for r in rows if r.get("refused")),
            "hostile_states_mixed": sum(1 for r in rows if r.get("weight")),
        }
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["workdir"] = str(workdir)
    return out
