"""The public island: any torch model and inner optimizer, the user's own loop, gossip in the background.

    with p2p_diloco.join(model, optimizer, bootstrap=[...], run_id="my-run") as island:
        for batch in data:
            loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
            island.step(loss=loss, tokens=batch.numel())
            if island.done:
                break

`SwarmIsland` is the facade over the parts that talk to the swarm (docs/DESIGN.md, 2.5.1): it builds
them, starts (resumes, joins, waits for members) and leaves. The user's loop takes the inner steps;
`step()`, called after each one, does the rest between two of them (`peers.rounds.steps`); what the
island reports of itself is `peers.reports.island`.

`done` turns True at a `step()` that ended the island's budget (rounds, tokens, seconds) or followed
`stop()`; under torchrun every rank sees it at the same step (`peers.torchrun.distributed`). `join` uses it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import torch

from p2p_diloco.config import DiLoCoConfig, DiscoveryConfig, IslandConfig, NetworkConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.modes import exchange_mode
from p2p_diloco.core.params import fingerprint, weights_digest
from p2p_diloco.core.spec import ModelSpec
from p2p_diloco.discovery.records import island_label
from p2p_diloco.exchange.linkemu import EmulatedLink
from p2p_diloco.peers.torchrun.distributed import STOP, SYNC, IntraIsland
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.reports.island import IslandReports
from p2p_diloco.peers.reports.metrics import LinkRates, MetricsLog, summary_line
from p2p_diloco.peers.gossip.reach import Door, PushInbox
from p2p_diloco.peers.rounds.losses import StepLosses
from p2p_diloco.peers.rounds.steps import IslandSteps
from p2p_diloco.peers.reports.sinks import RunInfo
from p2p_diloco.peers.opening import leave, open_island
from p2p_diloco.peers.parts import IslandParts
from p2p_diloco.peers.state.saving import IslandSaver
from p2p_diloco.peers.state.source import DISCOVERY_SETTLE_S, STALE_LAG
from p2p_diloco.peers.rounds.timebook import TimeBook

log = logging.getLogger(__name__)
ABANDON_FETCH_S = 1.0
"""On leaving, how long a running fetch may finish before it is abandoned."""


class SwarmIsland(IslandSteps, IslandReports):
    """One island of a swarm around a user's model and inner optimizer (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, *,
                 diloco: DiLoCoConfig | None = None, network: NetworkConfig | None = None,
                 discovery: DiscoveryConfig | None = None, island: IslandConfig | None = None,
                 eval_fn: Any = None, extra_state: Any = None, tokens_per_step: int = 1,
                 group: IntraIsland | None = None, link: EmulatedLink | None = None, probe_fn: Any = None,
                 stopped: Callable[[], bool] = lambda: False, parts: IslandParts | None = None,
                 model_spec: ModelSpec | None = None) -> None:
        """`link`: a WAN link to emulate for what this island sends (`bench member`, demos and tests);
        `stopped()`: asked to stop while the island waits for a bootstrap node, before `stop()` exists;
        `parts`: how its parts are built and which checks partners' states get (`peers.parts`);
        `model_spec`: what the model is, written into every checkpoint (`core.spec`: `export` and `generate`
        rebuild the model from it), its tokenizer copied into the run directory (`peers.state.modelfiles`)."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.diloco, self.network = diloco or DiLoCoConfig(), network or NetworkConfig()
        self.exchange = exchange_mode(self.diloco.exchange, self.diloco.update_codec, self.diloco.fragments)
        self.cfg = island or IslandConfig()
        parts = parts or IslandParts()
        self.eval_fn, self.group = eval_fn, group
        self.world = 1 if group is None else group.world
        self.tokens_per_step = tokens_per_step
        self.inbox = PushInbox()
        opened = open_island(self.cfg, discovery or DiscoveryConfig(), self.network, parts.log, self.inbox, link,
                             stopped)  # (`peers.opening`)
        self._run_dir, self.server, self.reach, self.membership = (opened.run_dir, opened.server, opened.reach,
                                                                   opened.membership)
        try:
            self.peer_id = self.membership.peer_id
            self.outer = OuterLoop(self.peer_id, model, self.diloco, parts.admission.bounds)
            # the initial weights name the run
            self.identity = Identity(self.peer_id, island_label(self.cfg.name, self.peer_id), fingerprint(model),
                                     weights_digest(self.outer.state.phi))
            self.saver = IslandSaver(self.cfg.run_dir, self.outer, self.identity, model, optimizer, scheduler,
                                     extra_state, model_spec)
            sinks = parts.sinks(parts.log, RunInfo(self.cfg.run_dir, self.name, opened.discovery.run_id, RunInfo.settings_of(
                diloco=self.diloco, island=self.cfg, network=self.network)))  # (TensorBoard, W&B: `peers.reports.sinks`)
        except BaseException:
            opened.close()
            raise
        self.timebook = TimeBook()
        """Where the training thread's time goes (`peers.rounds.timebook`)."""
        (self.publisher, self.source, self.guard, self.gossip, self.chooser, self.catching_up, self.admission,
         self.tally, self.alone, self.rounds) = parts.partner_side(
            opened, self.identity, self.outer, diloco=self.diloco, network=self.network, island=self.cfg,
            exchange=self.exchange, optimizer=optimizer, scheduler=scheduler, inbox=self.inbox, link=link,
            probe_fn=None if probe_fn is None else lambda: self.timebook.timed("probe", probe_fn),
            stopped=lambda: self._stop_asked)  # (`peers.parts`)
        self.metrics = MetricsLog(self.cfg.run_dir, sinks)
        (self.cfg.run_dir / "island.json").write_text(json.dumps({"peer_id": self.peer_id, "name": self.name,
                                                                  "endpoint": self.server.endpoint}))
        self.started_at, self._built = time.time(), time.monotonic()
        self.round = self.own_tokens = 0
        self.initial_loss: float | None = None
        self.eval_loss: float | None = None
        self.state = "joining"
        self.link_rates = LinkRates()
        self.done = self.weights_changed = False
        self._stop_asked = False
        self._started = self._closed = False
        self._t0: float | None = None
        self._returned_at = 0.0
        self._loss: float | None = None
        self.losses = StepLosses()

    # -- the user's side -------------------------------------------------------------------------
    def __enter__(self) -> SwarmIsland:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def share(self, value: int) -> int:
        """`value` as every rank of a torchrun island sees it: this rank's (rank 0's), told to the others."""
        return value if self.group is None else self.group.share(value)

    def stop(self) -> None:
        """Ask the island to stop: the round ends at the next `step()`, which sets `done` (signal-safe)."""
        self._stop_asked = True

    def start(self) -> SwarmIsland:
        """Resume (`IslandConfig.resume`) or join from the freshest member, publish, announce, and wait
        for `wait_for` islands. Called by `with`; on failure the island leaves and the error is raised."""
        if self._started:
            return self
        try:
            if self.cfg.resume:
                self.round, self.own_tokens = self.saver.resume()
            self._join_from_freshest(lead=STALE_LAG if self.cfg.resume else 1)
            self._tell_ranks(SYNC)  # the other ranks start from the state this one joined or resumed with
            self.initial_loss = self.eval_loss = self._evaluate()
            self.state = "training"
            self.publish(wait=True)  # served and announced before the wait for members
        except BaseException:
            self.close()
            raise
        self._started = True
        self.inbox.door = Door(self.identity, self.membership.members, self.chooser.shunned,
                               self.gossip.measured)
        if not self.source.wait_for(self.cfg.wait_for, self.cfg.join_timeout_s, training=True) and not self._stop_asked:
            log.warning("fewer than %d islands after %.0f s; starting anyway", self.cfg.wait_for, self.cfg.join_timeout_s)
        self._t0 = self._returned_at = time.monotonic()
        self.timebook.startup_s = self._t0 - self._built
        self.rounds.begin(0.0, training_from=self._t0)
        if self._stop_asked:  # stopped while starting: no round to train
            self.done = True
            self._tell_ranks(STOP)
        return self

    def _join_from_freshest(self, lead: int) -> None:
        """Start from the freshest members' state if the run is already going (`peers.state.source`).

        `lead`: how many versions ahead the freshest member must be. A resumed island passes
        `STALE_LAG`: a checkpoint the swarm has left that far behind would see every partner's
        state refused as too far until a catch-up landed, so it joins as a newcomer does, keeping
        its inner optimizer and data position."""
        # announced as joining (a record nobody fetches from), islands started together see each other at once
        self.membership.announce(self.record())
        self.source.wait_for(2, min(DISCOVERY_SETTLE_S, self.cfg.join_timeout_s))  # who is there?
        if (others := self.source.freshest()) and others[0].version >= self.version + lead:
            self.state = "syncing"
            self.tally.bytes_in += self.source.adopt(self.source.download(others, self.cfg.join_timeout_s), bool(self.round))

    def close(self) -> dict[str, Any]:
        """Leave cleanly: abandon the fetch, checkpoint, evaluate, remove the record, close sockets; the summary."""
        if self._closed:  # (safe to call twice)
            return self._summary
        self._closed, self.state = True, "leaving"
        steps = [("telling the other ranks", lambda: self._tell_ranks(STOP)),
                 ("abandoning the fetch", lambda: self.gossip.close(timeout=ABANDON_FETCH_S)),
                 ("publishing thread", self.publisher.close)]
        if self._started:
            steps += [("checkpoint", self.save_checkpoint), ("final evaluation", self._final_eval)]
        steps += [("leave", self.membership.leave), ("membership shutdown", self.membership.shutdown),
                  ("server close", self.server.close), ("metrics close", self.metrics.close),
                  ("run directory", self._run_dir.release)]
        leave(steps, saving=("checkpoint", "final evaluation"))
        return self._summary

    def _final_eval(self) -> None:
        self.eval_loss = self._evaluate()
        self.metrics.write({"summary": self._summary})
        if not self.cfg.quiet:  # mixes, refusals and why it trained alone, if it did (`summary_line`)
            summary_line(self._summary)
