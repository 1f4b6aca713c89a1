"""What an island reports of itself: its discovery record, its figures, each round's metrics row and
progress line, and its summary when it leaves.

`IslandReports` is a part of `peers.island.SwarmIsland` (its base class) that only reads: the
attributes it declares are the island's, set by `SwarmIsland.__init__`, and nothing here changes
them, except the time book's round, which each round's row closes (`TimeBook.end_round`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.peers.reports.metrics import progress_line
from p2p_diloco.peers.reports.figures import Figures

if TYPE_CHECKING:
    from p2p_diloco.config import DiLoCoConfig, IslandConfig
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.exchange.server import SnapshotServer
    from p2p_diloco.peers.rounds.alone import AloneWatch
    from p2p_diloco.peers.admission.admission import Admission
    from p2p_diloco.peers.gossip.worker import GossipWorker
    from p2p_diloco.peers.identity import Identity
    from p2p_diloco.peers.reports.metrics import LinkRates, MetricsLog
    from p2p_diloco.peers.gossip.publishing import Publisher
    from p2p_diloco.peers.gossip.reach import Reach
    from p2p_diloco.peers.rounds.schedule import Rounds
    from p2p_diloco.peers.rounds.tally import Tally
    from p2p_diloco.peers.rounds.timebook import TimeBook


class IslandReports:
    """The island's figures as its record, `figures()`, rows and summary (see the module docstring)."""

    peer_id: str
    identity: Identity
    cfg: IslandConfig
    diloco: DiLoCoConfig
    optimizer: torch.optim.Optimizer
    outer: OuterLoop
    server: SnapshotServer
    gossip: GossipWorker
    publisher: Publisher
    rounds: Rounds
    tally: Tally
    admission: Admission
    alone: AloneWatch
    reach: Reach
    link_rates: LinkRates
    metrics: MetricsLog
    timebook: TimeBook
    state: str
    round: int
    own_tokens: int
    started_at: float
    initial_loss: float | None
    eval_loss: float | None
    _loss: float | None
    _t0: float | None

    @property
    def version(self) -> int:
        return self.outer.state.version

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def bytes_out(self) -> int:
        """Bytes this island sent: what its server served, plus the states it pushed."""
        return self.server.stats()["bytes_sent"] + self.gossip.pushes["bytes"]

    def figures(self) -> Figures:
        """The island's figures now, what the dashboard shows of it: a dict whose every field, and the
        sign of `staleness` (own version minus the partner's), `peers.reports.figures.Figures` documents."""
        t = self.tally
        return {"peer_id": self.peer_id, "name": self.name, "version": self.version, "round": self.round,
                "tokens": self.own_tokens, "partner": t.last_partner, "staleness": t.last_staleness,
                "mixes": t.mixes, "refused": self.admission.refused, "failed_fetches": t.failed, "too_stale": t.too_stale,
                "alone": self.alone.reason, "fetches": self.rounds.choice.describe(), "bytes_in": t.bytes_in,
                "bytes_out": self.bytes_out,
                "loss": self.last_loss, "eval_loss": self.eval_loss, "state": self.state, "reach": self.reach.mode}

    @property
    def last_loss(self) -> float | None:
        """The loss last passed to `step()`, as a float; None while it is not finite (a record
        carries finite numbers only)."""
        return self._loss if self._loss is None or math.isfinite(self._loss) else None

    @property
    def _summary(self) -> dict[str, Any]:
        return {"peer_id": self.peer_id, "name": self.name, "initial_loss": self.initial_loss,
                "eval_loss": self.eval_loss, "version": self.version, "tokens": self.own_tokens,
                "rounds": self.round, "mixes": self.tally.mixes, "refused": self.admission.refused,
                "bounded": self.admission.counts["bounded"], "claims_clipped": self.admission.counts["claims"],
                "momenta_scaled": self.admission.counts["momentum_scaled"], "held": self.admission.counts["held"],
                "failed_fetches": self.tally.failed, "too_stale": self.tally.too_stale,
                "fetched": dict(self.tally.fetched),
                "alone": self.alone.reason, "alone_episodes": self.alone.episodes, "utilization": self.utilization(),
                "net_utilization": self.timebook.net_utilization(),
                "spent": self.timebook.summary(), "publish_s": round(self.publisher.background_s, 3),
                "coalesced": self.publisher.coalesced,
                "bytes_in": self.tally.bytes_in, "bytes_out": self.bytes_out, "reach": self.reach.mode,
                "pushes_sent": self.gossip.pushes["sent"], "pushes_failed": self.gossip.pushes["failed"],
                "pushes_taken": self.server.stats()["pushes_stored"]}

    def record(self, tokens_per_s: float = 0.0) -> IslandRecord:
        """This island's discovery record (link rates: see `LinkRates`)."""
        s = self.outer.state
        sent = self.bytes_out
        up, down = self.link_rates.update(time.monotonic(), sent, self.tally.bytes_in)
        fetched_from, fetched_bps = self.rounds.choice.measured_last
        budget, eta_s = self.budget_done()
        return IslandRecord(peer_id=self.peer_id, endpoint=self.server.endpoint, version=s.version, tokens=s.tokens,
                            tokens_per_s=tokens_per_s, loss=self.last_loss, eval_loss=self.eval_loss,
                            state=self.state, upload_bps=up, download_bps=down, bytes_sent=sent,
                            bytes_received=self.tally.bytes_in, last_partner=self.tally.last_partner,
                            refused=self.admission.refused, last_refused=self.admission.last_refused,
                            alone=self.alone.reason or "", fetches=self.rounds.choice.describe(),
                            fetched_from=fetched_from, fetched_bps=fetched_bps,
                            started_at=self.started_at, published_at=self.publisher.published_at,
                            timestamp=time.time(), model=self.identity.model, reach=self.reach.mode,
                            name=self.cfg.name or "", utilization=self.utilization(), time_split=self.timebook.split(),
                            lr=self.lr, budget=budget, eta_s=eta_s,
                            doubts=self.admission.ledger.doubts(self.admission.members()))

    @property
    def inner_seconds(self) -> float:
        """Seconds spent in the user's inner steps."""
        return self.timebook.total["inner"]

    def utilization(self) -> float:
        """Share of the training thread's time from the first inner step to the last round's end spent
        in the user's inner steps (`peers.rounds.timebook`)."""
        return self.timebook.utilization()

    @property
    def lr(self) -> float | None:
        """The inner optimizer's learning rate now (its first parameter group's; None if it has none)."""
        lr = self.optimizer.param_groups[0].get("lr") if self.optimizer.param_groups else None
        return float(lr) if isinstance(lr, (int, float, torch.Tensor)) and math.isfinite(float(lr)) else None

    def budget_done(self) -> tuple[float | None, float | None]:
        """(share of the island's budget spent, seconds left at this pace): the largest share of its
        rounds, tokens and seconds (`IslandConfig.max_*`); (None, None) without a budget."""
        c, elapsed = self.cfg, 0.0 if self._t0 is None else time.monotonic() - self._t0
        shares = [done / limit for done, limit in ((self.round, c.max_rounds), (self.own_tokens, c.max_tokens),
                                                   (elapsed, c.max_seconds)) if limit]
        if not shares:
            return None, None
        done = min(1.0, max(shares))
        return round(done, 4), (round(elapsed * (1 - done) / done, 1) if done > 0 else None)

    def _log_round(self, info: dict, steps: int, compute_s: float) -> None:
        """One metrics row and progress line per round: its figures, where its time went (`spent`, the
        training thread's, by part; `publish_s`, the publishing thread's, overlapped), its exchange's,
        the counts so far, the learning rates (`lr`, the inner optimizer's now; `outer_lr`) and the
        budget's share spent (`budget`, `eta_s`: `budget_done`); the sinks get it too (`MetricsLog`)."""
        budget, eta_s = self.budget_done()
        row = {"round": self.round, "version": self.version, "tokens": self.outer.state.tokens,
               "own_tokens": self.own_tokens, "steps": steps, "loss": self.last_loss,
               "eval_loss": self.eval_loss if self.round % self.cfg.eval_every == 0 else None,
               "tokens_per_s": self.rounds.tokens_per_s(), "bytes_out": self.bytes_out,
               "weight": None, "staleness": None, "inner_s": round(compute_s, 3),
               "wall_s": round(time.monotonic() - self._t0, 3), "utilization": self.utilization(),
               "spent": self.timebook.end_round(), "publish_s": round(self.publisher.background_s, 3),
               "coalesced": self.publisher.coalesced, "lr": self.lr, "outer_lr": self.diloco.outer_lr,
               "mixes": self.tally.mixes, "refused": self.admission.refused, "budget": budget, "eta_s": eta_s, **info}
        label = self.rounds.label(row.get("partner"))
        if row.get("partner"):
            row["partner_name"] = label
        self.metrics.write(row)
        if not self.cfg.quiet:
            progress_line(self.name, row, label)
