"""In-process simulator: K islands on a virtual clock, driven by the same core as real islands.

Three methods share the data, the initial weights and the token (or time) budget:

- `gossip`: asynchronous gossip DiLoCo. An island fetches one partner's published state when a
  round starts (the fetch overlaps its inner steps, `mix_delay=1`, as in the real swarm) and
  mixes it between the inner steps it arrives between, or at the round's end; with `mix_delay=0`
  it instead fetches the partner's state published at the end of the same round, waiting for the
  transfer. With `final_mix`, each island mixes one
  partner's last state when the budget is spent.
- `allreduce`: synchronous DiLoCo. Every round all islands average their pseudo-gradients; the
  round lasts as long as the slowest island plus a ring all-reduce.
- `dp`: data parallel with a K-times batch every step (one gradient all-reduce per step).

Virtual time: an inner step of a speed-1 island takes `step_seconds`; links cost latency plus
bytes over bandwidth. Compute time is accounted, not slept, so results depend only on the seed.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import torch

from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.sim.config import SimConfig
from p2p_diloco.core import codecs
from p2p_diloco.core.data import BatchSampler, Corpus, eval_batches
from p2p_diloco.core.device import resolve_device
from p2p_diloco.core.inner import InnerLoop, evaluate
from p2p_diloco.core.island import Island, load_vector
from p2p_diloco.core.model import build_model
from p2p_diloco.errors import ConfigError
from p2p_diloco.core.modes import exchange_mode, momentum_mode
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.exchange.cost import fetch_wire_bytes
from p2p_diloco.sim.gossip import GossipRun

log = logging.getLogger(__name__)

ISLAND_SEED_STRIDE = 1000
"""Island i of a run with seed s draws its batches from seed `s * ISLAND_SEED_STRIDE + i` (apart for
up to this many islands)."""
EVAL_SEED_OFFSET = 991
"""The held-out batches are drawn from `seed + EVAL_SEED_OFFSET`, apart from every island's batches."""
EVAL_BATCH_SIZE = 32
"""Sequences per held-out batch."""


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
    mixes_per_round: float | None = None
    """Partner states mixed with a weight above 0, per round of every island (gossip only)."""
    fetches: dict[str, int] | None = None
    """With `exchange="auto"`: fetches of whole states and of updates, and how often an island changed
    its choice (`changes`)."""

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("eval_loss", "eval_loss_worst", "eval_loss_consensus", "tokens",
                                             "bytes_sent_per_island", "virtual_seconds", "utilization",
                                             "mixes_per_round")}
        return out if self.fetches is None else {**out, "fetches": self.fetches}


class Simulation:
    """Runs the configured methods on one corpus; `run(method)` returns a `MethodResult`."""

    def __init__(self, sim: SimConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, diloco: DiLoCoConfig,
                 corpus: Corpus, progress=None) -> None:
        self.sim, self.model_cfg, self.diloco, self.corpus = sim, model_cfg, diloco, corpus
        if exchange_mode(diloco.exchange, diloco.update_codec, diloco.fragments).updates and sim.mix_delay != 1:
            raise ConfigError(f"diloco.exchange={diloco.exchange!r} (a public state) is simulated with mix_delay 1 "
                              "only; --exchange state for another mix_delay")
        self.block = model_cfg.resolved()["block_size"]
        self.step_tokens = train_cfg.batch_size * self.block
        steps_per_island = max(1, sim.tokens // (sim.islands * self.step_tokens))
        self.train_cfg = TrainConfig(**{**train_cfg.__dict__, "total_steps": steps_per_island})
        self.evals = eval_batches(corpus.val, self.block, sim.eval_batches, EVAL_BATCH_SIZE,
                                  seed=sim.seed + EVAL_SEED_OFFSET)
        self.progress = progress or (lambda method, done, total, loss: None)
        self._fetch_cost: dict[tuple, int] = {}
        self.device = resolve_device(train_cfg.device)
        """Where every island's model, optimizer and outer state live (`--device`; exchanged states
        take the codec's round trip on the host and are mixed on the device)."""

    # -- shared pieces -------------------------------------------------------------------------
    def _model(self) -> torch.nn.Module:
        torch.manual_seed(self.sim.seed)
        return build_model(self.model_cfg, self.corpus.vocab_size).to(self.device)

    def _sampler(self, i: int, batch: int | None = None) -> BatchSampler:
        return BatchSampler(self.corpus.train, self.block, batch or self.train_cfg.batch_size, self.sim.seed * ISLAND_SEED_STRIDE + i)

    def make_islands(self) -> list[Island]:
        base = self._model()
        out = []
        for i in range(self.sim.islands):
            model = build_model(self.model_cfg, self.corpus.vocab_size).to(self.device)
            model.load_state_dict(base.state_dict())
            out.append(Island(f"island-{i}", model, self.train_cfg, self.diloco, self._sampler(i)))
        return out

    def _eval_vector(self, model: torch.nn.Module, vec: torch.Tensor) -> float:
        load_vector(model, vec)
        return evaluate(model, self.evals)

    def evaluate_vector(self, vec: torch.Tensor) -> float:
        """Held-out loss of a flat parameter vector on this simulation's evaluation batches."""
        return self._eval_vector(build_model(self.model_cfg, self.corpus.vocab_size).to(self.device), vec)

    def link_seconds(self, nbytes: int, hops: int = 1) -> float:
        """Seconds to move `nbytes` over `hops` links at the slowest island's rate (the synchronous
        methods, whose every step waits for every island)."""
        K = self.sim.islands
        rate = min(min(self.sim.download(i), self.sim.upload(i)) for i in range(K))
        return hops * self.sim.latency_ms / 1000 + nbytes * 8 / (rate * 1e6)

    def link_mbps(self, i: int, j: int) -> float:
        """Mbit/s of island i's fetches from island j: the slower of j's upload and i's download."""
        return min(self.sim.download(i), self.sim.upload(j))

    def fetch_seconds(self, i: int, j: int, nbytes: int) -> float:
        """Seconds island i's fetch of `nbytes` from island j takes: a round trip, then the bytes at
        the link's rate (`link_mbps`)."""
        return 2 * self.sim.latency_ms / 1000 + nbytes * 8 / (self.link_mbps(i, j) * 1e6)

    def result(self, islands: list[Island], tokens: int, bytes_per_island: float, t: float, util: float) -> MethodResult:
        probe = islands[0].model
        losses = [self._eval_vector(probe, isl.state.phi) for isl in islands]
        consensus = self._eval_vector(probe, torch.stack([isl.state.phi for isl in islands]).mean(0))
        return MethodResult(sum(losses) / len(losses), max(losses), consensus, tokens, int(bytes_per_island), t, util, losses)

    def run(self, method: str) -> MethodResult:
        return {"gossip": self._gossip, "allreduce": self._allreduce, "dp": self._dp}[method]()

    # -- gossip --------------------------------------------------------------------------------
    def snapshot(self, island: Island) -> PartnerState:
        """What a partner would receive: the published state after the codec's round trip (the
        momentum's in its own codec, when it travels)."""
        s, c, momentum = island.state, self.sim.compression, island.momentum
        return PartnerState(phi=codecs.roundtrip(s.phi, c), m=codecs.roundtrip(s.m, momentum.codec) if momentum.travels
                            else None, version=s.version, tokens=s.tokens, peer=island.name)

    def state_bytes(self, n: int) -> int:
        """Bytes of one published state on the wire: anchor, plus momentum when it travels."""
        momentum = momentum_mode(self.diloco.momentum)
        m = codecs.encoded_nbytes(n, momentum.codec) if momentum.travels else 0
        return codecs.encoded_nbytes(n, self.sim.compression) + m

    def fetch_bytes(self, partner: PartnerState) -> int:
        """Bytes a receiver moves to fetch a published state, both ways, message by message
        (`exchange.cost`): the anchor, and the momentum when it is published, with every header."""
        n, momentum = partner.phi.numel(), momentum_mode(self.diloco.momentum)
        tensors = [("phi", n, self.sim.compression)]
        if partner.m is not None and momentum.travels:
            tensors.append(("m", n, momentum.codec))
        key = tuple(tensors)
        if key not in self._fetch_cost:
            self._fetch_cost[key] = fetch_wire_bytes(tensors, version=1, tokens=self.sim.tokens)
        return self._fetch_cost[key]

    def _gossip(self) -> MethodResult:
        exchange = exchange_mode(self.diloco.exchange, self.diloco.update_codec, self.diloco.fragments)
        if exchange.adaptive:
            from p2p_diloco.sim.auto import AutoGossipRun

            return AutoGossipRun(self).run()
        if exchange.updates:
            from p2p_diloco.sim.public import UpdatesGossipRun

            return UpdatesGossipRun(self).run()
        return GossipRun(self).run()

    # -- synchronous baselines -----------------------------------------------------------------
    def _ring_seconds(self, nbytes: int) -> tuple[float, float]:
        """(seconds, bytes sent per island) of a ring all-reduce of `nbytes` over K islands."""
        K = self.sim.islands
        per_island = 2 * (K - 1) / K * nbytes
        return self.link_seconds(int(per_island), hops=2 * (K - 1)), per_island

    def _allreduce(self) -> MethodResult:
        sim, K, H = self.sim, self.sim.islands, self.diloco.local_steps
        islands = self.make_islands()
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
            mean = torch.stack(deltas).mean(0).to(self.device)
            for isl in islands:  # absent islands apply the same update, so all stay identical
                isl.end_round([], delta=mean)
            tokens += len(present) * steps * self.step_tokens
            t += round_s
            sent += per_island * len(present) / K
            busy += sum(compute.values())
            idle += len(present) * round_s - sum(compute.values())
            self.progress("allreduce", tokens // self.step_tokens, total_steps, islands[present[0]].last_loss)
        return self.result(islands, tokens, sent, t, busy / max(1e-9, busy + idle))

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
