"""`p2p-diloco bench attack`: honest islands with one more member among them, as processes.

For each kind of poison (`bench/member.py`: NaN, weights x1e6, a random state, another run's
state, a momentum x1e4, weights x1.5, the initial weights, the last change reversed, noise at the
gate's edge, the quiet ones, and ALIE and IPM inside the honest spread) the swarm runs with
`honest` honest islands and `members` hostile islands of that kind (test doubles
that trains honestly and publishes the poison), all real `join` processes on loopback with the
default settings and an emulated WAN link; for each honest difference (`slow`: 10x slower, on a
tenth of the tokens; `other-data`: trained on another corpus) with one such member, whose states
must be mixed, not refused; once more without the member, a bystander island training alone in
another run taking its place on the machine (the honest islands share the CPU with as many
processes in every run, so only the member differs). Every honest island trains the same tokens
in every run. With `runs` above 1 each swarm runs that many times, so that a 1% difference can be
told from one run's noise (about 1%). The figures: each honest island's final eval loss (its
anchor on the simulator's held-out batches, as `bench swarm` evaluates) against the mean of the
runs without the member (`judged`: the mean, the worst honest island of each run on average, the
spread of the runs' means), the honest islands' roll-backs (`diverged`), and how many of the
member's states the honest ones refused and mixed (from their `metrics.jsonl`: one row per
round, naming the partner of its exchange and the partners refused before it); of the mixed ones,
how many the influence bound cut (`core.influence`); in the run without it, how many honest
states were refused (false refusals).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import fmean, stdev

from p2p_diloco.bench.swarm import final_losses, rounds
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.choices import HONEST_MEMBERS, POISONS
from p2p_diloco.errors import DataError
from p2p_diloco.peers.launch.demo import Swarm

KINDS = POISONS + HONEST_MEMBERS

TOKENS_PER_ISLAND = 368_640
"""What each island of `bench swarm`'s default run trains (1.5M tokens over 4 islands, whole rounds)."""


SLOWDOWN = 10.0
"""How much slower the `slow` member trains (on a tenth of the tokens, so that its run takes as long)."""


def other_corpus(workdir: Path) -> Path:
    """The `other-data` member's corpus, written into `workdir`: this project's documentation in one
    text file (English prose, where the others train on Python sources)."""
    root = Path(__file__).resolve().parents[2]
    docs = sorted(root.glob("*.md")) + sorted((root / "docs").glob("*.md"))
    if not docs:
        raise DataError(f"bench attack's other-data member trains on the project's documentation, not found "
                        f"in {root} (run it from a clone of the repository)")
    out = workdir / "other-data.txt"
    out.write_text("\n\n".join(p.read_text(encoding="utf-8") for p in docs), encoding="utf-8")
    return out


def _run(workdir: Path, honest: int, member: str | None, tokens: int, latency_ms: float,
         bandwidth_mbps: float, other_data: Path | None = None, members: int = 1) -> tuple[list[str], set[str]]:
    """One swarm to the end; returns the honest islands' names and the members' peer ids (`other_data`:
    the `other-data` member's corpus; `members`: how many of that kind, colluding where the kind
    does: every `drift` member pushes along one direction)."""
    workdir.mkdir(parents=True, exist_ok=True)
    swarm = Swarm(workdir, {"island": {"eval_every": 5}})
    names = [f"honest-{i}" for i in range(honest)]
    hostile = ["member"] if members == 1 else [f"member-{i}" for i in range(members)]
    size = honest + (len(hostile) if member is not None else 0)
    args = ["--run-id", "attack", "--max-tokens", str(tokens), "--wait-for", str(size), "--quiet"]
    entry = ("bench", "member", "--latency-ms", str(latency_ms), "--bandwidth-mbps", str(bandwidth_mbps))
    try:
        swarm.start_bootstrap()
        procs = [swarm.start_island(n, args, entry) for n in names]
        if member == "slow":
            extra = ["--max-tokens", str(max(1, int(tokens / SLOWDOWN))), "--slowdown", str(SLOWDOWN)]
        elif member == "other-data":
            extra = ["--data", str(other_data)]
        else:
            extra = ["--poison", str(member)]
        for name in hostile:
            if member is not None:
                procs.append(swarm.start_island(name, [*args, *extra], entry))
            else:  # the same load on the machine: islands that train alone, in another run
                procs.append(swarm.start_island(name.replace("member", "bystander"),
                                                [*args, "--run-id", f"attack-{name}", "--wait-for", "1"], entry))
        for p in procs:
            p.wait()
    finally:
        swarm.stop()
    if member is None:
        return names, set()
    return names, {json.loads((workdir / name / "island.json").read_text())["peer_id"] for name in hostile}


def _diverged(run_dir: Path, names: list[str]) -> int:
    """Roll-backs of the honest islands in one swarm (`peers.rounds.divergence` logs each)."""
    return sum((run_dir / f"{n}.log").read_text(errors="replace").count(" diverged (") for n in names
               if (run_dir / f"{n}.log").exists())


def _spread(xs: list[float]) -> float:
    """The sample standard deviation (0 for one value)."""
    return stdev(xs) if len(xs) > 1 else 0.0


def judged(losses: list[list[float]], clean_mean: float) -> dict:
    """The runs of one kind (each the honest islands' losses) against the clean runs' mean: the mean
    over every honest island of every run, the mean over runs of each run's worst honest island,
    and the spread of the runs' means, each relative to the clean mean."""
    means, worst = [fmean(run) for run in losses], [max(run) for run in losses]
    return {"mean": fmean(means), "ratio_to_clean_mean": fmean(means) / clean_mean,
            "worst_ratio_to_clean_mean": fmean(worst) / clean_mean, "spread": _spread(means) / clean_mean}


def run_bench_attack(kinds: tuple[str, ...] = KINDS, honest: int = 3, tokens: int = TOKENS_PER_ISLAND,
                     latency_ms: float = 100.0, bandwidth_mbps: float = 1000.0, workdir: Path | None = None,
                     runs: int = 1, members: int = 1) -> dict:
    """`runs` swarms without the members, then `runs` with `members` of each kind (run by run, so that
    a change of the machine's load over the bench falls on every kind alike); see the module docstring."""
    import tempfile

    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.sim.simulator import Simulation

    workdir = workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-attack-"))
    workdir.mkdir(parents=True, exist_ok=True)
    other_data = other_corpus(workdir) if "other-data" in kinds else None  # (before any swarm: it may be missing)
    simulation = Simulation(SimConfig(islands=honest), ModelConfig(), TrainConfig(), DiLoCoConfig(), load_corpus())

    started = time.monotonic()
    clean, counts = [], {"false_refusals": 0, "mixes": 0, "mixes_bounded": 0, "diverged": 0}
    found: dict[str, dict] = {kind: {"eval_loss": [], "diverged": 0, "member_states_refused": 0,
                                     "member_states_mixed": 0, "member_mixes_bounded": 0} for kind in kinds}
    for run in range(runs):
        run_dir = workdir / f"clean-{run}" if runs > 1 else workdir / "clean"
        names, _ = _run(run_dir, honest, None, tokens, latency_ms, bandwidth_mbps, members=members)
        clean.append(final_losses(simulation, run_dir, names))
        rows = [r for n in names for r in rounds(run_dir / n)]
        counts["false_refusals"] += sum(len(r.get("refused_from", [])) + bool(r.get("refused")) for r in rows)
        counts["mixes"] += sum(1 for r in rows if r.get("weight"))
        counts["mixes_bounded"] += sum(1 for r in rows if r.get("weight") and r.get("bounded"))
        counts["diverged"] += _diverged(run_dir, names)
        for kind in kinds:
            run_dir = workdir / f"{kind}-{run}" if runs > 1 else workdir / kind
            names, hostile = _run(run_dir, honest, kind, tokens, latency_ms, bandwidth_mbps, other_data, members)
            f = found[kind]
            f["eval_loss"].append(final_losses(simulation, run_dir, names))
            f["diverged"] += _diverged(run_dir, names)
            rows = [r for n in names for r in rounds(run_dir / n)]
            refused_mid_round = sum(sum(p in hostile for p in r.get("refused_from", [])) for r in rows)
            rows = [r for r in rows if r.get("partner") in hostile]
            f["member_states_refused"] += refused_mid_round + sum(1 for r in rows if r.get("refused"))
            f["member_states_mixed"] += sum(1 for r in rows if r.get("weight"))
            f["member_mixes_bounded"] += sum(1 for r in rows if r.get("weight") and r.get("bounded"))
    clean_mean = fmean([fmean(run) for run in clean])
    c = judged(clean, clean_mean)
    out = {"honest": honest, "members": members, "tokens_per_island": tokens, "runs": runs, "clean_eval_loss": clean,
           "clean_mean": clean_mean, "clean_worst_ratio_to_clean_mean": c["worst_ratio_to_clean_mean"],
           "clean_spread": c["spread"], "clean_false_refusals": counts["false_refusals"],
           "clean_mixes": counts["mixes"], "clean_mixes_bounded": counts["mixes_bounded"],
           "clean_diverged": counts["diverged"], "attacks": {}}
    for kind, f in found.items():
        out["attacks"][kind] = {**f, **judged(f["eval_loss"], clean_mean), "honest_member": kind in HONEST_MEMBERS}
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["workdir"] = str(workdir)
    return out
