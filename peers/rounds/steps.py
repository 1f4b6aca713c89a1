"""What the island does at each `step()` of the user's loop: the round's bookkeeping, its end, and the final mix.

`IslandSteps` is a part of `peers.island.SwarmIsland` (its base class, beside `peers.reports.island.IslandReports`):
the attributes it declares are the island's, set by `SwarmIsland.__init__`. `step()`, called after each
inner step, does the rest between two of them (`peers.rounds.schedule`: keep a fetch going, mix what
arrived, end the round), never waiting on the network; a round's end takes the outer step and a
snapshot of the state, which the publisher's thread encodes, serves and announces while the next round
trains (`peers.gossip.publishing`), then evaluates, logs and checkpoints; where every second goes is
booked (`peers.rounds.timebook`).
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from p2p_diloco.peers.rounds.losses import loss_of
from p2p_diloco.peers.rounds.schedule import ANNOUNCE_EVERY_S
from p2p_diloco.peers.torchrun.distributed import CARRY_ON, NEW_ROUND, STOP, SYNC

if TYPE_CHECKING:
    from p2p_diloco.config import DiLoCoConfig, IslandConfig
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.discovery.membership import Membership
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.peers.gossip.publishing import Publisher
    from p2p_diloco.peers.gossip.worker import GossipWorker
    from p2p_diloco.peers.rounds.losses import StepLosses
    from p2p_diloco.peers.reports.metrics import MetricsLog
    from p2p_diloco.peers.rounds.divergence import DivergenceGuard
    from p2p_diloco.peers.rounds.schedule import Rounds
    from p2p_diloco.peers.rounds.timebook import TimeBook
    from p2p_diloco.peers.state.saving import IslandSaver
    from p2p_diloco.peers.torchrun.distributed import IntraIsland


class IslandSteps:
    """The island's side of each inner step (see the module docstring)."""

    cfg: IslandConfig
    diloco: DiLoCoConfig
    outer: OuterLoop
    membership: Membership
    gossip: GossipWorker
    publisher: Publisher
    guard: DivergenceGuard
    rounds: Rounds
    timebook: TimeBook
    metrics: MetricsLog
    saver: IslandSaver
    losses: StepLosses
    group: IntraIsland | None
    eval_fn: Any
    tokens_per_step: int
    world: int
    round: int
    own_tokens: int
    eval_loss: float | None
    done: bool
    weights_changed: bool
    _started: bool
    _closed: bool
    _stop_asked: bool
    _returned_at: float
    _loss: float | None

    record: Callable[..., IslandRecord]
    """The island's record now (`IslandReports.record`)."""
    _log_round: Callable[[dict, int, float], None]
    """A round's row and progress line (`IslandReports._log_round`)."""

    def step(self, loss: Any = None, tokens: int | None = None) -> None:
        """Call after each inner optimizer step: round bookkeeping, mixing and gossip (see the module docstring).

        `loss` (a float, a one-element tensor, or an object with a `.loss` tensor such as a Hugging Face
        `ModelOutput`; else a `TypeError`) is what the dashboard shows and what the divergence guard
        checks (a tensor on an accelerator is read only with others, at most `READ_EVERY` steps
        later: `peers.rounds.losses.StepLosses`); `tokens` those the step trained on on this process
        (default `tokens_per_step`), counted for the budget and for token-weighted mixing."""
        if not self._started or self._closed:
            raise RuntimeError("SwarmIsland.step() before start() (use `with join(...) as island:`) or after close()")
        if self.done:
            return
        value = None if loss is None else loss_of(loss)  # (a TypeError leaves the island as it was)
        now = time.monotonic()
        rnd = self.rounds.rnd
        rnd.compute_s += now - self._returned_at
        self.timebook.add("inner", now - self._returned_at)
        if value is not None:
            self.losses.add(value)
        self.outer.round_steps += 1
        rnd.tokens += (self.tokens_per_step if tokens is None else tokens) * self.world
        heartbeat = now - rnd.last_announce >= ANNOUNCE_EVERY_S and not self.publisher.busy()
        ended = self.rounds.over(self.own_tokens)
        if heartbeat or ended or self.losses.due():
            self._read_losses()
        if heartbeat:  # keep watchers current mid-round
            self.membership.announce(self.record(self.rounds.tokens_per_s()))
            rnd.last_announce = now
        if ended:
            self._end_round()
            self.done = self.rounds.budget_spent(self.round, self.own_tokens)
            self.rounds.begin(rnd.compute_s)
        if not self.done:
            with self.timebook.spend("mix"):
                self.rounds.between_steps()
        else:  # (before STOP: the other ranks take the weights the final mix made, and gather with it)
            self._final()
        changed = self.weights_changed or self.rounds.mixing.changed
        self._tell_ranks(STOP if self.done else NEW_ROUND if ended else SYNC if changed else CARRY_ON)
        self._returned_at = time.monotonic()
        self.timebook.step_done(self._returned_at - now)

    def _read_losses(self) -> None:
        """The losses kept since the last read, to the divergence guard (after a roll-back, the rest
        were of weights it undid). Waiting for them is waiting for the inner steps queued on the device."""
        t0 = time.monotonic()
        with self.timebook.spend("inner"):
            values = self.losses.read()
        self.rounds.rnd.compute_s += time.monotonic() - t0
        for value in values:
            self._loss = value
            if self.guard.after_step(value, self.rounds.mixing.suspect()):
                self.weights_changed = True
                break

    def _final(self) -> None:
        """After the last round: the last publish served, then the final mix (`Rounds.final_mix`)."""
        t0 = time.monotonic()
        self.timebook.frozen = True  # (the last round's end is past: what follows is `final`)
        self.publisher.flush()
        if self.diloco.final_mix and not self._stop_asked:
            info = self.rounds.final_mix()
            if info is not None:
                self.metrics.write({"final_mix": info})
        self.timebook.final_s += time.monotonic() - t0

    def _end_round(self) -> None:
        """Mix what arrived after the last step, take the outer step (`Rounds.finish`), snapshot the
        state for the publishing thread (which serves and announces it), then evaluate, checkpoint and
        log, each booked in the time book."""
        rnd = self.rounds.rnd
        with self.timebook.spend("end"):
            if not self.guard.weights_finite():  # never an outer step from non-finite weights
                self.guard.roll_back("non-finite weights at the round's end", self.rounds.mixing.suspect())
            info, steps = self.rounds.finish()
            self.round += 1
            self.own_tokens += rnd.tokens
            self.publish()
        if self.round % self.cfg.eval_every == 0:
            with self.timebook.spend("eval"):
                self.eval_loss = self._evaluate()
        if self.round % self.cfg.checkpoint_every == 0:
            with self.timebook.spend("checkpoint"):
                self.save_checkpoint()
        self._log_round(info, steps, rnd.compute_s)

    def _tell_ranks(self, cmd: int) -> None:
        """Under torchrun, what this step did, to the other ranks (`peers.torchrun.distributed`)."""
        self.weights_changed = self.rounds.mixing.changed = False
        if self.group is not None:
            self.group.tell(cmd, self.outer.slices.params)

    def save_checkpoint(self) -> Path | None:
        """Write the whole island (`peers.state.saving`); None when it would hold non-finite values."""
        return self.saver.save(self.round, self.own_tokens)

    def _evaluate(self) -> float | None:
        return None if self.eval_fn is None else float(self.eval_fn())

    def publish(self, wait: bool = False) -> None:
        """Snapshot the state for the publishing thread, which serves it, then pushes it to the relay
        and announces the record made now (`peers.gossip.publishing`); `wait`: until it is served."""
        record = self.record(self.rounds.tokens_per_s())

        def served() -> None:
            self.gossip.push_to_relay()
            self.membership.announce(record.replace(published_at=self.publisher.published_at, timestamp=time.time()))
        self.publisher.publish(self.rounds.choice.parts(self.publisher.public_side.update_bytes, self.membership.members()),
                               then=served, wait=wait)
