"""In-process simulator: K islands on a virtual clock, driven by the same core as real islands.

Three methods share the data, the initial weights and the token (or time) budget:

- `gossip`: asynchronous gossip DiLoCo. An island fetches one partner's published state when a
  round starts (the fetch overlaps its inner steps, `mix_delay=1`, as in the real swarm) and
  mixes it between the inner steps it arrives between (`mix_at="arrival"`) or when the round
  ends (`"round-end"`); with `mix_delay=0` it instead fetches the partner's state published at
  the end of the same round, waiting for the transfer.
- `allreduce`: synchronous DiLoCo. Every round all islands average their pseudo-gradients; the
  round lasts as long as the slowest island plus a ring all-reduce.
- `dp`: data parallel with a K-times batch every step (one gradient all-reduce per step).

Virtual time: an inner step of a speed-1 island takes `step_seconds`; links cost latency plus
bytes over bandwidth. Compute time is accounted, not slept, so results depend only on the seed.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

import torch

from p2p_diloco.config import DiLoCoConfig, ModelConfig, SimConfig, TrainConfig
from p2p_diloco.core import codecs
from p2p_diloco.core.data import BatchSampler, Corpus, eval_batches
from p2p_diloco.core.inner import InnerLoop, evaluate
from p2p_diloco.core.island import Island, load_vector
from p2p_diloco.core.model import build_model
from p2p_diloco.core.outer import PartnerState, mix

log = logging.getLogger(__name__)
@dataclass
class MethodResult:
    eval_loss: float
    eval_loss_worst: float
    eval_loss_consensus: float
    tokens: int
    bytes_sent_per_island: int
    virtual_seconds: float
    utilization: float
    per_island: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("eval_loss", "eval_loss_worst", "eval_loss_consensus", "tokens",
                                              "bytes_sent_per_island", "virtual_seconds", "utilization")}


class Simulation:
    """Runs the configured methods on one corpus; `run(method)` returns a `MethodResult`."""

    def __init__(self, sim: SimConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, diloco: DiLoCoConfig,
                 corpus: Corpus, progress=None) -> None:
        self.sim, self.model_cfg, self.diloco, self.corpus = sim, model_cfg, diloco, corpus
        self.block = model_cfg.resolved()["block_size"]
        self.step_tokens = train_cfg.batch_size * self.block
        steps_per_island = max(1, sim.tokens // (sim.islands * self.step_tokens))
        self.train_cfg = TrainConfig(**{**train_cfg.__dict__, "total_steps": steps_per_island})
        self.evals = eval_batches(corpus.val, self.block, sim.eval_batches, 32, seed=sim.seed + 991)
        self.progress = progress or (lambda method, done, total, loss: None)

    # -- shared pieces -------------------------------------------------------------------------
    def _model(self) -> torch.nn.Module:
        torch.manual_seed(self.sim.seed)
        return build_model(self.model_cfg)

    def _sampler(self, i: int, batch: int | None = None) -> BatchSampler:
        return BatchSampler(self.corpus.train, self.block, batch or self.train_cfg.batch_size, self.sim.seed * 1000 + i)

    def _islands(self) -> list[Island]:
        base = self._model()
        out = []
        for i in range(self.sim.islands):
            model = build_model(self.model_cfg)
            model.load_state_dict(base.state_dict())
            out.append(Island(f"island-{i}", model, self.train_cfg, self.diloco, self._sampler(i)))
        return out

    def _eval_vector(self, model: torch.nn.Module, vec: torch.Tensor) -> float:
        load_vector(model, vec)
        return evaluate(model, self.evals)

    def evaluate_vector(self, vec: torch.Tensor) -> float:
        """Held-out loss of a flat parameter vector on this simulation's evaluation batches."""
        return self._eval_vector(build_model(self.model_cfg), vec)

    def _link_seconds(self, nbytes: int, hops: int = 1) -> float:
        return hops * self.sim.latency_ms / 1000 + nbytes * 8 / (self.sim.bandwidth_mbps * 1e6)

    def _result(self, islands: list[Island], tokens: int, bytes_per_island: float, t: float, util: float) -> MethodResult:
        probe = islands[0].model
        losses = [self._eval_vector(probe, isl.state.phi) for isl in islands]
        consensus = self._eval_vector(probe, torch.stack([isl.state.phi for isl in islands]).mean(0))
        return MethodResult(sum(losses) / len(losses), max(losses), consensus, tokens, int(bytes_per_island), t, util, losses)

    def run(self, method: str) -> MethodResult:
        return {"gossip": self._gossip, "allreduce": self._allreduce, "dp": self._dp}[method]()


    # -- gossip --------------------------------------------------------------------------------
    def _snapshot(self, island: Island) -> PartnerState:
        """What a partner would receive: the published state after the codec's round trip."""
        s, c = island.state, self.sim.compression
        send_m = self.diloco.momentum == "mixed"
        send_delta = self.diloco.mix_pseudo_gradient
        return PartnerState(phi=codecs.roundtrip(s.phi, c), m=codecs.roundtrip(s.m, c) if send_m else None,
                            delta=codecs.roundtrip(s.delta, c) if send_delta else None,
                            version=s.version, tokens=s.tokens, peer=island.name)

    def state_bytes(self, n: int) -> int:
        """Bytes of one published state on the wire: anchor, plus momentum and delta when mixed."""
        parts = 1 + (self.diloco.momentum == "mixed") + self.diloco.mix_pseudo_gradient
        return parts * codecs.encoded_nbytes(n, self.sim.compression)

    def _gossip(self) -> MethodResult:
        sim, K, H, dl = self.sim, self.sim.islands, self.diloco.local_steps, self.diloco
        islands = self._islands()
        rng = random.Random(sim.seed)
        round_seconds = dl.round_seconds or H * sim.step_seconds
        nbytes = self.state_bytes(islands[0].state.phi.numel())
        fetch_s = self._link_seconds(nbytes, hops=2)
        published = [self._snapshot(isl) for isl in islands]
        sent, busy, idle, rounds = [0] * K, [0.0] * K, [0.0] * K, [0] * K
        plan: list[dict] = [{} for _ in range(K)]
        tokens, t_end = 0, 0.0

        def online(j: int, t: float) -> bool:
            return not (plan[j].get("offline") and t < plan[j]["end"])

        def choose(i: int, t: float) -> int | None:
            shift = 1 + random.Random(sim.seed * 7919 + rounds[i]).randrange(K - 1)
            j = (i + shift) % K  # one shift per round index: a permutation when islands are in step
            if online(j, t):
                return j
            others = [o for o in range(K) if o != i and online(o, t)]
            return rng.choice(others) if others else None

        committed = 0  # tokens of rounds started so far: the last rounds are cut to land on the budget

        def start(i: int, t: float) -> None:
            nonlocal committed
            remaining = sim.tokens - committed if sim.time_budget is None else math.inf
            if remaining < self.step_tokens:
                plan[i] = {"offline": True, "end": math.inf}
                return
            if rng.random() < sim.drop_prob:
                plan[i] = {"offline": True, "end": t + round_seconds}
                return
            dt = sim.step_seconds / sim.speed(i)
            steps = max(1, min(H, math.floor(round_seconds / dt + 1e-9), remaining // self.step_tokens))
            committed += steps * self.step_tokens
            p = {"steps": steps, "busy": steps * dt, "end": t + steps * dt, "partner": None, "arrives_after": steps}
            if sim.mix_delay == 1 and (j := choose(i, t)) is not None:
                p["partner"] = published[j]
                sent[j] += nbytes
                idle[i] += max(0.0, fetch_s - p["busy"])
                p["end"] = t + max(p["busy"], fetch_s)
                if dl.mix_at == "arrival":  # mixed between the inner steps it arrives between
                    p["arrives_after"] = min(steps, math.ceil(fetch_s / dt - 1e-9))
            plan[i] = p

        for i in range(K):
            start(i, 0.0)
        total_steps = max(1, sim.tokens // self.step_tokens)
        while True:
            t = min(p["end"] for p in plan)
            if t == math.inf or (sim.time_budget is not None and t > sim.time_budget):
                break
            group = [i for i in range(K) if abs(plan[i]["end"] - t) < 1e-9]
            trained = [i for i in group if not plan[i].get("offline")]
            for i in trained:
                isl, p = islands[i], plan[i]
                for step in range(p["steps"]):
                    if step == p["arrives_after"]:
                        isl.mix_arrived(p["partner"])
                    isl.inner_step()
                late = p["partner"] is not None and p["arrives_after"] == p["steps"]
                isl.end_round([p["partner"]] if late else [])
                busy[i] += p["busy"]
                rounds[i] += 1
                tokens += p["steps"] * self.step_tokens
            next_t = t
            if sim.mix_delay == 0 and trained:
                fresh = {i: self._snapshot(islands[i]) for i in trained}
                views = [fresh.get(j, published[j]) for j in range(K)]
                for i in trained:
                    if (j := choose(i, t)) is not None:
                        isl = islands[i]
                        mix(isl.state, views[j], isl.weigh([views[j]])[0][1], dl)
                        isl.begin_round()
                        sent[j] += nbytes
                        idle[i] += fetch_s
                next_t = t + fetch_s
            for i in trained:
                published[i] = self._snapshot(islands[i])
            t_end = t
            self.progress("gossip", tokens // self.step_tokens, total_steps, islands[trained[0]].last_loss if trained else None)
            for i in group:
                start(i, next_t)
        util = sum(busy) / max(1e-9, sum(busy) + sum(idle))
        return self._result(islands, tokens, sum(sent) / K, t_end, util)

    # -- synchronous baselines -----------------------------------------------------------------
    def _ring_seconds(self, nbytes: int) -> tuple[float, float]:
        """(seconds, bytes sent per island) of a ring all-reduce of `nbytes` over K islands."""
        K = self.sim.islands
        per_island = 2 * (K - 1) / K * nbytes
        return self._link_seconds(int(per_island), hops=2 * (K - 1)), per_island

    def _allreduce(self) -> MethodResult:
        sim, K, H = self.sim, self.sim.islands, self.diloco.local_steps
        islands = self._islands()
        rng = random.Random(sim.seed)
        n = islands[0].state.phi.numel()
        comm_s, per_island = self._ring_seconds(codecs.encoded_nbytes(n, sim.compression))
        tokens, t, sent, busy, idle = 0, 0.0, 0.0, 0.0, 0.0
        total_steps = max(1, sim.tokens // self.step_tokens)
        while True:
            present = [i for i in range(K) if rng.random() >= sim.drop_prob] or [0]
            steps = H if sim.time_budget is not None else min(H, (sim.tokens - tokens) // (len(present) * self.step_tokens))
            if steps < 1:
                break
            compute = {i: steps * sim.step_seconds / sim.speed(i) for i in present}
            round_s = max(compute.values()) + comm_s
            if sim.time_budget is not None and t + round_s > sim.time_budget:
                break
            deltas = []
            for i in present:
                for _ in range(steps):
                    islands[i].inner_step()
                deltas.append(codecs.roundtrip(islands[i].pseudo_gradient(), sim.compression))
            mean = torch.stack(deltas).mean(0)
            for isl in islands:  # absent islands apply the same update, so all stay identical
                isl.end_round([], delta=mean)
            tokens += len(present) * steps * self.step_tokens
            t += round_s
            sent += per_island * len(present) / K
            busy += sum(compute.values())
            idle += len(present) * round_s - sum(compute.values())
            self.progress("allreduce", tokens // self.step_tokens, total_steps, islands[present[0]].last_loss)
        return self._result(islands, tokens, sent, t, busy / max(1e-9, busy + idle))

    def _dp(self) -> MethodResult:
        sim, K = self.sim, self.sim.islands
        model = self._model()
        inner = InnerLoop(model, self.train_cfg)
        samplers = [self._sampler(i) for i in range(K)]
        n = sum(p.numel() for p in model.parameters())
        comm_s, _ = self._ring_seconds(4 * n)
        step_s = max(sim.step_seconds / sim.speed(i) for i in range(K)) + comm_s
        tokens, t, steps, busy = 0, 0.0, 0, 0.0
        total_steps = max(1, sim.tokens // self.step_tokens)
        while True:
            if sim.time_budget is not None and t + step_s > sim.time_budget:
                break
            if sim.time_budget is None and sim.tokens - tokens < K * self.step_tokens:
                break
            batches = [s.next() for s in samplers]
            loss = inner.train_step(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))
            tokens += K * self.step_tokens
            t += step_s
            steps += 1
            busy += sum(sim.step_seconds / sim.speed(i) for i in range(K))
            self.progress("dp", tokens // self.step_tokens, total_steps, loss)
        loss = evaluate(model, self.evals)
        # one full fp32 vector per step per island: a lower bound for a ring all-reduce
        return MethodResult(loss, loss, loss, tokens, 4 * n * steps, t, busy / max(1e-9, K * t), [loss])
