"""Never alone without saying so: an island that mixes no partner while others train tells why.

A swarm whose links are too slow for what it sends, or whose partners' states keep failing, still
trains: each island alone, which is worse than it looks from a loss curve. `AloneWatch` counts what
the rounds since the last mix saw (fetches that failed, states that arrived too stale to weigh
anything, states refused, rounds that found nobody to fetch from) and, after such rounds while
other members train, says so once: a warning in the log, the `alone` field of the island's record
(which `status` and the dashboard show), and the island's summary. The first mix after that ends
it, with one line more.

Its reasons, first match first:
- `another run's weights`: partners' states were refused as another run's (islands whose initial
  weights differ: a model built without the same seed), or `another model`;
- `nobody reachable`: no fetch could even start (an outbound-only island with no reachable member
  and no relay, or members nobody can fetch from);
- `every partner refused`: every state that arrived was refused (implausible, non-finite, ...),
  unless the link is too slow for a state in a round: states that arrive that late are far off;
- else what the link measured, the states too stale or refused, the fetches that failed.
The first three are certain after `SURE_ROUNDS` rounds; the others take `ALONE_ROUNDS`. An island
started without a bootstrap address says at once that it trains alone (`no bootstrap`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from p2p_diloco.discovery.records import MAX_ALONE_CHARS

log = logging.getLogger(__name__)
NO_BOOTSTRAP = ("no bootstrap: started without a bootstrap address (`join --bootstrap`, `bootstrap=` of the API), "
                "so no other island can find this one; give every island of the run the same one")
SEED_HINT = ("their initial weights differ from this island's: seed the model the same on every island, "
             "torch.manual_seed before building it, [train] seed for join")
ALONE_ROUNDS = 10
"""Rounds without a mix, while other members train, after which an island says it trains alone
(with the default `max_staleness` of 8, a state fetched that long ago no longer counts)."""
SURE_ROUNDS = 3
"""Rounds without a mix after which an island says it trains alone when the cause is certain: every
state that reached it was refused, or it found nobody to fetch from."""
ALONE_MIN_S = 10.0
"""... and at least this many seconds: short rounds end before discovery has even shown a
partner's first trained state (records travel in a second or two)."""


@dataclass(frozen=True)
class Link:
    """What an island measured of its partners' links, to say why it trains alone."""

    rate_bps: float | None
    """Bytes per second its fetches got (the running one's, between its chunks, when none completed;
    None: unknown)."""
    state_bytes: int
    """Bytes of one whole state as this island publishes it (a partner's is the same size)."""
    round_s: float
    """The length of its last round, in seconds."""
    running_s: float = 0.0
    """How long the fetch running now has run (0: none runs)."""
    updates: bool = False
    """The island fetches updates of public states already, not whole states."""


class AloneWatch:
    """Counts an island's exchanges since its last mix; says once when it trains alone, and why."""

    def __init__(self, name: str, rounds: int = ALONE_ROUNDS, min_s: float = ALONE_MIN_S, *,
                 sure_rounds: int = SURE_ROUNDS, bootstrap: bool = True, outbound: bool = False,
                 relay: bool = False) -> None:
        """`bootstrap`: the island was given a bootstrap address; `outbound`: nobody can dial it;
        `relay`: a bootstrap relay serves outbound-only members' states."""
        self.name, self.rounds, self.min_s, self.sure_rounds = name, rounds, min_s, sure_rounds
        self.outbound, self.relay = outbound, relay
        self.unmixed_rounds = 0
        """Rounds since the last mix during which other members trained."""
        self.idle_rounds = 0
        """... of which no exchange ran in (no fetch started or running, nothing pushed in)."""
        self.refusals: dict[str, str] = {}
        """Partners (by label) whose states were refused since the last mix, and why, the last refused last."""
        self.foreign: dict[str, str] = {}
        """... those refused as another `run` or `model` (`ForeignState.kind`)."""
        self.unmixed_since: float | None = None
        """When the first of those rounds ended (monotonic)."""
        self.failed = self.too_stale = 0
        """Fetches that failed, and states that arrived too stale to weigh anything, since the last mix."""
        self.last_error: str | None = None
        self.worst_lag = 0
        self.reason: str | None = None
        """Why the island trains alone, while it does (None otherwise)."""
        self.episodes = 0
        """How many times it started to train alone."""
        self._mixed_now = self._exchanged_now = False
        if not bootstrap:
            self._say(NO_BOOTSTRAP)

    def exchanged(self) -> None:
        """A fetch started, or a partner pushed its state, this round."""
        self._exchanged_now = True

    def fetch_failed(self, error: str) -> None:
        self.failed += 1
        self.last_error = error
        self._exchanged_now = True

    def arrived_stale(self, lag: int) -> None:
        self.too_stale += 1
        self.worst_lag = max(self.worst_lag, lag)
        self._exchanged_now = True

    def refused(self, partner: str, why: str, foreign: str | None = None) -> None:
        """The state of `partner` (its label) was refused, for `why`; `foreign`: `run` or `model` when
        it is another run's or model's (`ForeignState.kind`)."""
        self.refusals.pop(partner, None)
        self.refusals[partner] = why  # (the last one last)
        if foreign is not None:
            self.foreign[partner] = foreign
        self._exchanged_now = True

    def mixed(self) -> None:
        if self.reason is not None:
            log.info("%s mixes a partner's state again, after %d rounds alone", self.name, self.unmixed_rounds)
        self.unmixed_rounds = self.idle_rounds = self.failed = self.too_stale = self.worst_lag = 0
        self.last_error = self.reason = self.unmixed_since = None
        self.refusals, self.foreign = {}, {}
        self._mixed_now = True

    def end_round(self, others: int, link: Link, max_staleness: int, now: float) -> str | None:
        """A round ended (at `now`, monotonic) with `others` members training besides this one; the
        reason it trains alone when it has just begun to (logged here, once), else None."""
        mixed, self._mixed_now = self._mixed_now, False
        exchanged, self._exchanged_now = self._exchanged_now or link.running_s > 0, False
        if mixed or others == 0:  # a lone island is not alone among others: nothing to say
            return None
        self.unmixed_rounds += 1
        self.idle_rounds += not exchanged
        self.unmixed_since = now if self.unmixed_since is None else self.unmixed_since
        sure = self.refusals or self.idle_rounds == self.unmixed_rounds
        if (self.reason is not None or self.unmixed_rounds < (min(self.sure_rounds, self.rounds) if sure else self.rounds)
                or now - self.unmixed_since < self.min_s):
            return None
        return self._say(self._why(others, link, max_staleness))

    def _say(self, why: str) -> str:
        """Start an episode alone, for `why` (made printable ASCII and bounded, as a record wants it)."""
        why = why.encode("ascii", "replace").decode()
        self.reason = "".join(c if c.isprintable() else " " for c in why)[:MAX_ALONE_CHARS]
        self.episodes += 1
        log.warning("%s trains alone: %s", self.name, self.reason)
        return self.reason

    def _why(self, others: int, link: Link, max_staleness: int) -> str:
        while_ = f"while {others} other{'s' * (others > 1)} train"
        for kind, what, hint in (("run", "another run's weights", SEED_HINT),
                                 ("model", "another model", "every island must train the same model")):
            if foreign := [p for p, k in self.foreign.items() if k == kind]:
                return (f"{what}: the states of {', '.join(foreign)} were refused as another {kind}'s ({hint}); "
                        f"nothing mixed in {self.unmixed_rounds} rounds {while_}")
        if self.idle_rounds == self.unmixed_rounds:
            where = ("this island is outbound-only (nobody can dial it), no member it could dial trains, and no "
                     "relay serves the others (`p2p-diloco bootstrap --relay`)" if self.outbound and not self.relay else
                     "none could be fetched from (outbound-only without a relay, another model, or too far behind)")
            return f"nobody reachable: no exchange in {self.unmixed_rounds} rounds {while_}; {where}"
        last = list(self.refusals.values())[-1][:100] if self.refusals else ""
        slow = bool(link.rate_bps) and link.state_bytes / link.rate_bps > link.round_s
        if self.refusals and not slow:  # (on a slow link, states refused as far off are the link's doing)
            return (f"every partner refused: the states of {', '.join(self.refusals)} were refused, nothing mixed in "
                    f"{self.unmixed_rounds} rounds {while_} (last: {last})")
        parts = [f"no partner state mixed in {self.unmixed_rounds} rounds {while_}"]
        if link.rate_bps:
            fetch_s = link.state_bytes / link.rate_bps
            parts.append(f"{link.rate_bps * 8 / 1e6:.2f} Mbit/s measured from partners: a {link.state_bytes / 1e6:.2f} "
                         f"MB state takes {fetch_s:.0f} s, {fetch_s / max(link.round_s, 1e-3):.0f} rounds")
            if fetch_s > link.round_s:
                parts.append("longer rounds (-H) would fit it" if link.updates else
                             "updates fit such a link (--exchange updates --update-codec sign)")
        if self.too_stale:
            parts.append(f"{self.too_stale} arrived too stale (up to {self.worst_lag} versions, bound {max_staleness})")
        if self.failed:
            parts.append(f"{self.failed} fetches failed (last: {(self.last_error or '')[:80]})")
        if self.refusals:
            parts.append(f"states of {', '.join(self.refusals)} refused (last: {last[:80]})")
        if link.running_s > link.round_s:
            parts.append(f"a fetch has run for {link.running_s:.0f} s")
        if not (link.rate_bps or link.running_s or self.failed or self.too_stale):
            parts.append("no fetch finished")
        return "; ".join(parts)
