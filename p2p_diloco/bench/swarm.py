"""`p2p-diloco bench swarm`: real islands on loopback against the simulator and data parallel.

K island processes (the demo's machinery) train an equal share of a token budget over an
emulated WAN link; their final anchors are then evaluated on the simulator's held-out batches,
and the simulator runs `gossip` and `dp` with the same model, data, H, codec, link and total
tokens, its virtual inner step as long as the islands' measured one (so a partner's state arrives
as many steps into a round as it did for real). With `runs` > 1 the swarm runs that many times
and its loss is the mean: runs of unchanged code spread over about 2%. Utilization comes from each
island's `metrics.jsonl`: inner-step seconds over wall time; `net_utilization` leaves the effect
probe out (the islands' summaries, `peers.rounds.timebook`), which the simulator does not model, and
`spent_shares` says where each island's time went. Bytes moved are every frame of the
islands' fetches, both ways (`Fetcher.wire_bytes`), against what the simulator charges for its
own run (`exchange.cost`).
"""

from __future__ import annotations

import time
from pathlib import Path

from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.sim.config import SimConfig
from p2p_diloco.peers.state import checkpoint
from p2p_diloco.peers.launch.demo import DemoConfig, run_swarm
from p2p_diloco.peers.reports.metrics import read_metrics


def rounds(run_dir: Path) -> list[dict]:
    """An island's per-round rows from its `metrics.jsonl`."""
    return [r for r in read_metrics(run_dir) if "round" in r]


def final_losses(simulation, run_dir: Path, names: list[str]) -> list[float]:
    """Each island's last checkpointed anchor, evaluated on `simulation`'s held-out batches."""
    return [simulation.evaluate_vector(checkpoint.load(checkpoint.latest(run_dir / n / "checkpoints"))
                                       .tensors[checkpoint.ANCHOR]) for n in names]


def utilization(rows: list[dict]) -> float:
    """Share of an island's training wall time spent in inner steps, from its round rows."""
    return sum(r["inner_s"] for r in rows) / max(rows[-1]["wall_s"], 1e-9) if rows else 0.0


def shares(spent: dict[str, float]) -> dict[str, float]:
    """An island's summary's `spent` (`peers.rounds.timebook`) as shares of its time from the first step to the
    last round's end (start-up and the final mix apart)."""
    parts = {k: v for k, v in spent.items() if k not in ("startup", "final")}
    whole = sum(parts.values()) or 1.0
    return {k: round(v / whole, 4) for k, v in parts.items()}


def step_seconds(rows: list[dict]) -> float:
    """Mean seconds of one inner step over the given round rows: the simulator's clock for the same run."""
    return sum(r["inner_s"] for r in rows) / max(1, sum(r["steps"] for r in rows))


def run_bench_swarm(islands: int = SimConfig.islands, tokens: int = SimConfig.tokens,
                    latency_ms: float = SimConfig.latency_ms,
                    bandwidth_mbps: float | tuple[float, ...] | None = SimConfig.bandwidth_mbps,
                    compression: str = SimConfig.compression, local_steps: int = DiLoCoConfig.local_steps,
                    workdir: Path | None = None, runs: int = 1, momentum: str = DiLoCoConfig.momentum,
                    exchange: str = DiLoCoConfig.exchange, update_codec: str = DiLoCoConfig.update_codec,
                    eval_batches: int = SimConfig.eval_batches) -> dict:
    """Run the swarm `runs` times (runs of the same code differ by which partner each island draws
    and when each state lands), then the two simulations once; losses are means over the runs.
    With `exchange="updates"` the simulation's partners are a ring too, as the islands'. With one
    rate per island (`bandwidth_mbps`), each is that island's uplink, as `bench member` emulates it;
    the simulation gives its islands those uploads and downloads as fast as the fastest uplink.
    `eval_batches`: held-out batches the simulations and the swarm's checkpoints are evaluated on."""
    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.simulator import Simulation

    train = TrainConfig()
    round_tokens = local_steps * train.batch_size * ModelConfig().resolved()["block_size"]
    per_island = max(1, tokens // islands // round_tokens) * round_tokens  # H-step rounds, as the simulator's
    swarms = []
    for k in range(runs):
        where = workdir / f"run-{k}" if workdir is not None and runs > 1 else workdir
        cfg = DemoConfig(islands=islands, max_tokens=per_island, latency_ms=latency_ms, bandwidth_mbps=bandwidth_mbps,
                         local_steps=local_steps, compression=compression, update_codec=update_codec, run_id="bench",
                         workdir=where, extra_args=("--momentum", momentum, "--exchange", exchange))
        started = time.monotonic()
        run_dir, names, summaries = run_swarm(cfg)
        wall_s = time.monotonic() - started
        swarms.append((run_dir, names, summaries, {n: rounds(run_dir / n) for n in names}, wall_s))
    total = sum(s["tokens"] for s in swarms[0][2])
    step_s = step_seconds([r for *_, rows, _ in swarms for island in rows.values() for r in island])
    uplinks = bandwidth_mbps if isinstance(bandwidth_mbps, tuple) else None
    sim = SimConfig(islands=islands, methods=("gossip", "dp"), tokens=total, latency_ms=latency_ms,
                    bandwidth_mbps=max(uplinks) if uplinks else bandwidth_mbps or 1e6, upload_mbps=uplinks,
                    compression=compression, step_seconds=step_s, eval_batches=eval_batches)
    diloco = DiLoCoConfig(local_steps=local_steps, momentum=momentum, exchange=exchange, update_codec=update_codec)
    simulation = Simulation(sim, ModelConfig(), train, diloco, load_corpus())
    gossip, dp = simulation.run("gossip"), simulation.run("dp")
    per_run = []
    for run_dir, names, summaries, rows, wall_s in swarms:
        losses = final_losses(simulation, run_dir, names)
        mean = sum(losses) / len(losses)
        per_run.append({"swarm_eval_loss": mean, "ratio_to_dp": mean / dp.eval_loss,
                        "ratio_to_sim_gossip": mean / gossip.eval_loss, "per_island_eval_loss": losses,
                        "tokens_per_island": [s["tokens"] for s in summaries],
                        "utilization": [utilization(rows[n]) for n in names],
                        "net_utilization": [round(s["net_utilization"], 4) for s in summaries],
                        "spent_shares": [shares(s["spent"]) for s in summaries],
                        "step_seconds": round(step_seconds([r for n in names for r in rows[n]]), 4),
                        "bytes_moved": (moved := sum(s["bytes_in"] for s in summaries)),
                        "bytes_to_sim": moved / (gossip.bytes_sent_per_island * islands),
                        "mixes_per_round": sum(s["mixes"] for s in summaries) / max(1, sum(s["rounds"] for s in summaries)),
                        "per_island_mixes_per_round": [round(s["mixes"] / max(1, s["rounds"]), 3) for s in summaries],
                        "failed_fetches": sum(s["failed_fetches"] for s in summaries),
                        "swarm_wall_s": round(wall_s, 1), "workdir": str(run_dir)})
    swarm_loss = sum(r["swarm_eval_loss"] for r in per_run) / runs
    swarm_mixes = sum(r["mixes_per_round"] for r in per_run) / runs
    return {"islands": islands, "tokens": total, "latency_ms": latency_ms, "bandwidth_mbps": bandwidth_mbps,
            "compression": compression, "local_steps": local_steps, "momentum": momentum, "exchange": exchange,
            "update_codec": update_codec, "runs": runs,
            "step_seconds": round(step_s, 4),
            "swarm_eval_loss": swarm_loss, "sim_gossip_eval_loss": gossip.eval_loss, "dp_eval_loss": dp.eval_loss,
            "ratio_to_dp": swarm_loss / dp.eval_loss, "ratio_to_sim_gossip": swarm_loss / gossip.eval_loss,
            "ratio_to_dp_runs": [r["ratio_to_dp"] for r in per_run],
            "swarm_mixes_per_round": swarm_mixes, "sim_mixes_per_round": gossip.mixes_per_round,
            "mixes_ratio_to_sim": swarm_mixes / gossip.mixes_per_round if gossip.mixes_per_round else None,
            "sim_gossip_bytes": gossip.bytes_sent_per_island * islands,
            "bytes_to_sim_runs": [round(r["bytes_to_sim"], 4) for r in per_run],
            "utilization_min": min(u for r in per_run for u in r["utilization"]),
            "net_utilization_min": min(u for r in per_run for u in r["net_utilization"]), "per_run": per_run}
