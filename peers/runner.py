"""The island process: join the swarm, train rounds, gossip in the background, checkpoint, leave.

`IslandRunner` owns one island's pieces (model and state machine, snapshot server, membership,
gossip worker, partner chooser, metrics) and runs its rounds; `p2p_diloco.peers.process` starts
it (resume or join) and stops it. One round:

1. if no fetch is running, choose a partner and start fetching its snapshot in the background;
   early in the round only a partner that is not one of the last two and has reached this
   island's version, or is about to (one version behind), qualifies, and the fetch waits for it
   to publish this version: the state mixed is then one round old, as in the simulator, rather
   than two, and the load spreads;
2. up to H inner steps, stopping early when `round_seconds` is spent (a slow island does fewer
   steps, nobody waits for it), and a few more while most other islands are behind in their
   rounds (`p2p_diloco.peers.pacing`); with `mix_at=arrival` (the default) the snapshot is mixed into the
   anchor and the running weights between the inner steps it arrives between;
3. take the snapshot if it arrived after the last inner step (else mix nothing this round), take
   the outer step (`Island.end_round`), publish the new state, announce the record, log metrics.

Ctrl+C or SIGTERM stop after the current inner step: the running fetch is abandoned, a checkpoint
is written, the record removed, exit code 130 / 143.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, ModelConfig, NetworkConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler, eval_batches, load_corpus
from p2p_diloco.core.inner import evaluate
from p2p_diloco.core.island import Island
from p2p_diloco.core.model import build_model
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.discovery import open_membership
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.errors import TransportError
from p2p_diloco.peers import checkpoint
from p2p_diloco.peers.distributed import STEP, STOP, IntraIsland
from p2p_diloco.peers.gossip import GossipWorker, partner_state
from p2p_diloco.peers.metrics import LinkRates, MetricsLog, progress_line
from p2p_diloco.peers.pacing import catch_up_seconds
from p2p_diloco.peers.partners import PartnerChooser

log = logging.getLogger(__name__)
ANNOUNCE_EVERY_S = 2.0
"""Mid-round, the island's record is announced again this often (the dashboard's tokens/s and loss)."""
FRESH_RECORD_S = 3 * ANNOUNCE_EVERY_S
"""Pacing counts only records younger than this: a dead island's record lingers until it expires."""
RETRY_PARTNER_S = 0.5
"""How often a round that found no partner at its start looks again (one may have published since)."""
ABANDON_FETCH_S = 1.0
"""On leaving, how long a running fetch may finish before it is abandoned."""


@dataclass
class _Round:
    """One round's schedule while its inner steps run (see the module docstring)."""

    start: float
    """Monotonic time the round began."""
    fresh_until: float
    """Until then only a partner at this island's version (or one behind) is fetched."""
    limit: int
    """Most inner steps: H and its stretch, within the token budget."""
    next_try: float
    """When to look for a partner again, if no fetch runs."""
    last_announce: float
    fetching: bool = False
    arrived: dict | None = None
    """The exchange figures of a partner mixed mid-round (`mix_at=arrival`)."""
    stretch_until: float | None = None
    """Past H: when to stop training on (set once H steps are done)."""

    @classmethod
    def begin(cls, runner: IslandRunner, last_compute_s: float) -> _Round:
        now = time.monotonic()
        runner.island.round_steps = 0
        return cls(start=now, fresh_until=now + runner.cfg.same_version_wait * last_compute_s,
                   limit=runner.round_limit(), next_try=now, last_announce=now)


class _StopFlag:
    """Set by SIGINT / SIGTERM; the loop checks it between inner steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum, _frame) -> None:
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 0 if self.signum is None else 128 + self.signum


class IslandRunner:
    """Owns one island's pieces and runs its rounds; see the module docstring."""

    def __init__(self, cfg: IslandConfig, model_cfg: ModelConfig, train: TrainConfig, diloco: DiLoCoConfig,
                 network: NetworkConfig, discovery: DiscoveryConfig, data: str | None = None,
                 group: IntraIsland | None = None) -> None:
        from p2p_diloco.exchange.server import SnapshotServer

        self.cfg, self.diloco, self.network, self.group = cfg, diloco, network, group
        self.stop = _StopFlag()
        self.corpus = load_corpus(data)
        block = model_cfg.resolved()["block_size"]
        model = initial_model(model_cfg, train, group)
        self.membership = open_membership(discovery)
        self.peer_id = self.membership.peer_id
        self.name = cfg.name or self.peer_id[:8]
        data_seed = int.from_bytes(hashlib.sha256(self.peer_id.encode()).digest()[:4], "little")
        if group is not None:  # every rank draws its own batches; rank 0 tells them its seed
            data_seed = group.share_seed(data_seed)
        self.island = Island(self.peer_id, model, train, diloco, BatchSampler(self.corpus.train, block, train.batch_size, data_seed))
        if group is not None:  # one step of the island is one step on every rank
            self.island.tokens_per_step *= group.world
        self.evals = eval_batches(self.corpus.val, block, cfg.eval_batches, 16)
        self.server = SnapshotServer(f"tcp://{cfg.bind_host}:{cfg.port}", network, announce_host=cfg.announce_host)
        self.gossip = GossipWorker(network, timeout_s=network.fetch_timeout_s)
        self.chooser = PartnerChooser(self.peer_id, diloco.max_staleness, rng=random.Random(data_seed))
        self.metrics = MetricsLog(cfg.run_dir)
        (cfg.run_dir / "island.json").write_text(json.dumps({"peer_id": self.peer_id, "name": self.name,
                                                             "endpoint": self.server.endpoint}))
        self.started_at = time.time()
        self.round = 0
        self.bytes_in = 0
        self.inner_seconds = 0.0
        self._t0: float | None = None
        self._own_tokens = 0
        self.initial_loss: float | None = None
        self.eval_loss: float | None = None
        self.last_partner: str | None = None
        self.published_at = 0.0
        self.state = "joining"
        self.link_rates = LinkRates()

    # -- records ---------------------------------------------------------------------------------
    def record(self, tokens_per_s: float = 0.0) -> IslandRecord:
        """This island's discovery record (link rates: see `LinkRates`)."""
        s = self.island.state
        sent = self.server.stats()["bytes_sent"]
        up, down = self.link_rates.update(time.monotonic(), sent, self.bytes_in)
        return IslandRecord(peer_id=self.peer_id, endpoint=self.server.endpoint, version=s.version, tokens=s.tokens,
                            tokens_per_s=tokens_per_s, loss=self.island.last_loss, eval_loss=self.eval_loss,
                            state=self.state, upload_bps=up, download_bps=down, bytes_sent=sent,
                            bytes_received=self.bytes_in, last_partner=self.last_partner,
                            started_at=self.started_at, published_at=self.published_at, timestamp=time.time())

    def publish(self) -> None:
        s = self.island.state
        tensors = {"phi": s.phi}
        if self.diloco.momentum == "mixed":
            tensors["m"] = s.m
        if self.diloco.mix_pseudo_gradient:
            tensors["delta"] = s.delta
        self.server.publish(tensors, s.version, s.tokens, meta={"peer_id": self.peer_id})
        self.published_at = time.time()

    def wait_for_members(self, count: int, timeout: float) -> bool:
        """Wait until discovery shows `count` islands, this one included (at most `timeout` s, or
        until a signal); True if it did."""
        deadline = time.monotonic() + timeout
        while len(self.membership.members()) < count:
            if self.stop.signum or time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    # -- rounds ----------------------------------------------------------------------------------
    def _start_fetch(self, fresh_until: float | None = None) -> bool:
        """Start fetching a partner's snapshot unless one is on its way; True if one is.

        Until `fresh_until` (monotonic), only a partner at this island's version, or one version
        behind and so about to publish it, that was not one of the last two partners qualifies;
        the fetch then waits for it to publish this version, until `fresh_until`.
        """
        if self.gossip.busy:
            return True
        v = self.island.state.version
        members = self.membership.members()
        if fresh_until is None:
            partner = self.chooser.choose(members, v)
            return partner is not None and self.gossip.start(partner)
        partner = self.chooser.choose(members, v, min_version=v - 1, skip_recent=True)
        return partner is not None and self.gossip.start(partner, min_version=v, wait_until=fresh_until)

    def _take_partner(self) -> tuple[list[PartnerState], dict]:
        result = self.gossip.take()
        if result is None:
            return [], {"partner": None, "fetch_s": None, "bytes_in": 0}
        info = {"partner": result.peer_id, "fetch_s": round(result.seconds, 3), "wait_s": round(result.waited_s, 3),
                "bytes_in": result.nbytes}
        if result.snapshot is None:
            self.chooser.failed(result.peer_id)
            info["fetch_error"] = result.error
            return [], info
        self.chooser.succeeded(result.peer_id, result.nbytes, result.seconds)
        self.bytes_in += result.nbytes
        try:
            return [partner_state(result.snapshot, self.island.state.phi.numel())], info
        except TransportError as e:
            log.info("%s", e)
            self.chooser.failed(result.peer_id)
            info["fetch_error"] = str(e)
            return [], info

    def _mix_if_arrived(self) -> dict | None:
        """Between inner steps (`mix_at=arrival`): mix a partner state the moment its fetch is done.

        The anchor and the running weights move together (on every rank of a torchrun island), so
        the rest of the round trains from the mixed point. Returns the exchange's metrics, or None
        while nothing has arrived.
        """
        if self.diloco.mix_at != "arrival" or self.gossip.busy:
            return None
        partners, info = self._take_partner()
        if info["partner"] is None:
            return None
        info["weight"] = 0.0
        if partners:
            info["staleness"] = self.island.state.version - partners[0].version
            info["weight"], shift = self.island.mix_arrived(partners[0])
            info["mixed_after_steps"] = self.island.round_steps
            if shift is not None and self.group is not None:
                self.group.share_shift(shift)
        return info

    def round_limit(self) -> int:
        """Most inner steps this round may take: H and its stretch, within the token budget."""
        H = self.diloco.local_steps
        limit = H + int(self.cfg.max_stretch * H)
        if self.cfg.max_tokens is not None:
            per_step = self.island.tokens_per_step
            limit = min(limit, -(-(self.cfg.max_tokens - self._own_tokens) // per_step))
        return max(1, limit)

    def utilization(self) -> float:
        """Share of wall time since the first inner step spent in inner steps."""
        return 0.0 if self._t0 is None else self.inner_seconds / max(time.monotonic() - self._t0, 1e-6)

    def _done(self) -> bool:
        c = self.cfg
        return bool(self.stop.signum
                    or (c.max_rounds is not None and self.round >= c.max_rounds)
                    or (c.max_tokens is not None and self._own_tokens >= c.max_tokens)
                    or (c.max_seconds is not None and time.monotonic() - self._t0 >= c.max_seconds))

    def train(self) -> int:
        """Run rounds until a limit or a signal; returns the process exit code."""
        self._start_training()
        last_compute_s = 0.0
        while not self._done():
            rnd = _Round.begin(self, last_compute_s)
            self._inner_steps(rnd)
            compute_s = last_compute_s = time.monotonic() - rnd.start
            self.inner_seconds += compute_s
            steps = self.island.round_steps  # the outer step starts the next round's count
            if steps == 0:
                break
            self._log_round(self._end_round(rnd, steps, compute_s), steps, compute_s)
        return self.stop.exit_code

    def _start_training(self) -> None:
        """Evaluate the starting point, publish it, announce the island, wait for `wait_for` islands."""
        self.initial_loss = evaluate(self.island.model, self.evals)
        self.state = "training"
        if self.group is not None:  # the other ranks start from the anchor rank 0 joined or resumed with
            self.group.share_anchor(self.island.state.phi)
        self.publish()
        self.membership.announce(self.record())
        if not self.wait_for_members(self.cfg.wait_for, self.cfg.join_timeout_s) and not self.stop.signum:
            log.warning("fewer than %d islands after %.0f s; starting anyway", self.cfg.wait_for, self.cfg.join_timeout_s)
        self._t0 = time.monotonic()  # utilization counts from the first inner step

    def _inner_steps(self, rnd: _Round) -> None:
        """The round's inner steps, with the fetch kept going and a partner mixed the moment it arrives."""
        isl = self.island
        while isl.round_steps < rnd.limit and not self.stop.signum:
            if isl.round_steps >= self.diloco.local_steps and self._stretch_over(rnd):
                break
            self._keep_fetching(rnd)
            rnd.arrived = rnd.arrived or self._mix_if_arrived()
            if self.group is not None:
                self.group.command(STEP)
            step_start = time.monotonic()
            isl.inner_step()
            if self.cfg.slowdown > 1:
                time.sleep((self.cfg.slowdown - 1) * (time.monotonic() - step_start))
            if time.monotonic() - rnd.last_announce >= ANNOUNCE_EVERY_S:  # keep watchers current mid-round
                self.membership.announce(self.record(self._tokens_per_s(isl.round_steps, time.monotonic() - rnd.start)))
                rnd.last_announce = time.monotonic()
            if self.diloco.round_seconds and time.monotonic() - rnd.start >= self.diloco.round_seconds:
                break

    def _stretch_over(self, rnd: _Round) -> bool:
        """Past H: train on while most of the others are behind in their rounds (`max_stretch`)."""
        if rnd.stretch_until is None:
            rnd.stretch_until = time.monotonic() + catch_up_seconds(
                self.membership.members(), self.peer_id, self.published_at, time.time(), fresh_s=FRESH_RECORD_S)
        return time.monotonic() >= rnd.stretch_until

    def _keep_fetching(self, rnd: _Round) -> None:
        """Start a fetch when none runs and it is time to look for a partner (again)."""
        now = time.monotonic()
        if rnd.fetching or now < rnd.next_try:
            return
        same_version = now < rnd.fresh_until
        rnd.fetching = self._start_fetch(rnd.fresh_until if same_version else None)
        # look again soon, and at once when the wait for a partner at our version ends
        rnd.next_try = min(now + RETRY_PARTNER_S, rnd.fresh_until) if same_version else now + RETRY_PARTNER_S

    def _end_round(self, rnd: _Round, steps: int, compute_s: float) -> dict:
        """Mix what arrived after the last step, take the outer step, publish and announce; returns
        the round's exchange figures."""
        isl = self.island
        partners, info = self._take_partner()  # a fetch that arrived after the last inner step
        weights = isl.end_round(partners)
        if partners:
            info["weight"], info["staleness"] = weights[0], isl.state.version - 1 - partners[0].version
            info["mixed_after_steps"] = steps
        elif rnd.arrived is not None:
            info = rnd.arrived
        if self.group is not None:
            self.group.share_anchor(isl.state.phi)
        self.round += 1
        self._own_tokens += steps * isl.tokens_per_step
        if self.round == 1 and self.cfg.max_seconds and not (self.cfg.max_tokens or self.cfg.max_rounds):
            # a time-bounded island sizes its cosine schedule from the speed of its first round
            total = max(1, int(steps / max(compute_s, 1e-6) * self.cfg.max_seconds))
            isl.inner.cfg = dataclasses.replace(isl.inner.cfg, total_steps=total)
        if self.round % self.cfg.eval_every == 0:
            self.eval_loss = evaluate(isl.model, self.evals)
        self.publish()
        self.last_partner = info["partner"] if info.get("weight") else self.last_partner
        self.membership.announce(self.record(self._tokens_per_s(steps, compute_s)))
        return info

    def _tokens_per_s(self, steps: int, compute_s: float) -> float:
        return steps * self.island.tokens_per_step / max(compute_s, 1e-6)

    def _log_round(self, info: dict, steps: int, compute_s: float) -> None:
        """One metrics row and progress line per round; a checkpoint every `checkpoint_every` rounds."""
        isl = self.island
        row = {"round": self.round, "version": isl.state.version, "tokens": isl.state.tokens,
               "own_tokens": self._own_tokens, "steps": steps, "loss": isl.last_loss,
               "eval_loss": self.eval_loss if self.round % self.cfg.eval_every == 0 else None,
               "tokens_per_s": self._tokens_per_s(steps, compute_s), "bytes_out": self.server.stats()["bytes_sent"],
               "weight": None, "staleness": None, "inner_s": round(compute_s, 3),
               "wall_s": round(time.monotonic() - self._t0, 3), "utilization": self.utilization(), **info}
        self.metrics.write(row)
        if not self.cfg.quiet:
            progress_line(self.name, row)
        if self.round % self.cfg.checkpoint_every == 0:
            self.save_checkpoint()

    def finish(self) -> dict:
        """Leave cleanly: abandon the fetch, checkpoint, evaluate, remove the record, close sockets."""
        self.state = "leaving"
        if self.group is not None:
            self.group.command(STOP)
        self.gossip.close(timeout=ABANDON_FETCH_S)
        self.save_checkpoint()
        final_eval = evaluate(self.island.model, self.evals)
        summary = {"peer_id": self.peer_id, "name": self.name, "initial_loss": self.initial_loss, "eval_loss": final_eval,
                   "version": self.island.state.version, "tokens": self._own_tokens, "rounds": self.round,
                   "utilization": self.utilization(),
                   "bytes_in": self.bytes_in, "bytes_out": self.server.stats()["bytes_sent"]}
        self.metrics.write({"summary": summary})
        for step in (self.membership.leave, self.membership.shutdown, self.server.close, self.metrics.close):
            try:
                step()
            except Exception:  # leaving must not fail half-way: each step is independent
                log.exception("while leaving: %s failed", getattr(step, "__name__", step))
        return summary

    def save_checkpoint(self) -> Path:
        tensors, meta = checkpoint.pack_island(self.island, self.round, self.peer_id)
        return checkpoint.save(self.cfg.run_dir / "checkpoints", tensors, meta)


def initial_model(model_cfg: ModelConfig, train: TrainConfig, group: IntraIsland | None) -> torch.nn.Module:
    """The run's initial weights (the same on every island: they share the seed), DDP-wrapped on torchrun."""
    torch.manual_seed(train.seed)
    model = build_model(model_cfg)
    return group.wrap(model) if group is not None else model
