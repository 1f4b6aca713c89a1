"""The simulator's `gossip` method: asynchronous gossip DiLoCo on a virtual clock.

Each island's round is planned when it starts (`_plan`): how many inner steps fit, when it ends,
and whether a partner's state arrives during it, and after how many steps (it is mixed between the
two inner steps it arrives between, or at the round's end). As in the swarm, an island fetches one
state at a time and never waits for it: a fetch starts when a round starts and none is running, at
the partner's state as last published, takes the link's time (`Simulation.fetch_seconds`: the
slower of the partner's upload and the island's download), and lands in whichever round it ends
in, at the staleness it then has. The clock then jumps from one round's end to the next (`run`):
the islands whose rounds end at that time train them (`_train`), exchange at once if
`mix_delay=0` (`_exchange_now`), publish, and plan their next round. With `final_mix`, each island
mixes one partner's last state when the budget is spent (`_final_mix`), or the fetch it was
running, if either lands within the swarm's wait (`core.schedule.final_fetch_in_time`). Compute
time is accounted, not slept, so a run depends only on the seed.

Partners: one shift per round index (`core.schedule.shifted_partner`, which the swarm's islands
prefer too), so while the islands are in step each round's choice is a permutation (every island
serves one fetch; an offline partner is replaced by a random online one); with updates
(`Exchange.ring`) the next online island (`core.schedule.ring_successor`). As in the swarm, a partner that has trained nothing yet is not
fetched (`core.schedule.worth_fetching`): the first round mixes nothing.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from p2p_diloco.config import NetworkConfig
from p2p_diloco.core.modes import exchange_mode
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.schedule import final_fetch_in_time, ring_successor, shifted_partner, worth_fetching

if TYPE_CHECKING:
    from p2p_diloco.sim.simulator import MethodResult, Simulation

class GossipRun:
    """One run of the `gossip` method over a `Simulation`'s islands, data and link."""

    def __init__(self, simulation: Simulation) -> None:
        self.s, self.sim, self.dl = simulation, simulation.sim, simulation.diloco
        K = self.sim.islands
        self.islands = simulation.make_islands()
        self.exchange = exchange_mode(self.dl.exchange, self.dl.update_codec, self.dl.fragments)
        self.rng = random.Random(self.sim.seed)
        self.round_seconds = self.dl.round_seconds or self.dl.local_steps * self.sim.step_seconds
        self.published = [simulation.snapshot(isl) for isl in self.islands]
        self.sent, self.busy, self.idle, self.rounds = [0] * K, [0.0] * K, [0.0] * K, [0] * K
        self.plans: list[dict] = [{} for _ in range(K)]
        self.inflight: list[tuple[PartnerState, float, float] | None] = [None] * K
        """Each island's running fetch: the state it will get, when it started and how long it takes."""
        self.ended = [0.0] * K
        """When each island's last round ended."""
        self.mixes = [0] * K
        """Partner states each island mixed with a weight above 0."""
        self.tokens = 0
        self.committed = 0
        """Tokens of the rounds started so far: the last rounds are cut to land on the budget."""

    def _online(self, j: int, t: float) -> bool:
        return not (self.plans[j].get("offline") and t < self.plans[j]["end"])

    def _choose(self, i: int, t: float, final: bool = False) -> int | None:
        """Island i's partner for its next round (`final`: for the final mix, when every island is
        done and still serves its last state)."""
        K, r = self.sim.islands, self.rounds[i]
        if self._ring(i):
            return ring_successor([o for o in range(K) if final or self._online(o, t)], i)
        j = shifted_partner(range(K), i, r, salt=self.sim.seed)
        if final or self._online(j, t):
            return j
        others = [o for o in range(K) if o != i and self._online(o, t)]
        return self.rng.choice(others) if others else None

    def _ring(self, i: int) -> bool:
        """Whether island i's next fetch takes its partner from the ring (`Exchange.ring`)."""
        return self.exchange.ring

    def _plan(self, i: int, t: float) -> None:
        """Plan island i's round starting at virtual time t: steps, end, partner, arrival."""
        sim, step_tokens = self.sim, self.s.step_tokens
        remaining = sim.tokens - self.committed if sim.time_budget is None else math.inf
        if remaining < step_tokens:
            self.plans[i] = {"offline": True, "end": math.inf}
            return
        if self.rng.random() < sim.drop_prob:
            self.plans[i] = {"offline": True, "end": t + self.round_seconds}
            return
        dt = sim.step_seconds / sim.speed(i)
        steps = max(1, min(self.dl.local_steps, math.floor(self.round_seconds / dt + 1e-9), remaining // step_tokens))
        self.committed += steps * step_tokens
        p = {"steps": steps, "busy": steps * dt, "end": t + steps * dt, "partner": None, "arrives_after": steps}
        if sim.mix_delay == 1:
            if self.inflight[i] is None and (j := self._choose(i, t)) is not None \
                    and worth_fetching(self.published[j].tokens):
                self.inflight[i] = (*self._fetch_counted(i, j), t)
            if self.inflight[i] is not None:
                partner, fetch_s, started = self.inflight[i]
                lands = (started - t) + fetch_s  # seconds into this round
                if lands <= p["busy"] + 1e-9:
                    self.inflight[i] = None
                    # mixed between the inner steps it arrives between (0: before the first)
                    p["partner"], p["arrives_after"] = partner, min(steps, max(0, math.ceil(lands / dt - 1e-9)))
        self.plans[i] = p

    def _fetch_counted(self, i: int, j: int) -> tuple[PartnerState, float]:
        """`_fetch`, its bytes counted as sent by j: what i fetches and the fetch's seconds."""
        partner, nbytes = self._fetch(i, j)
        self.sent[j] += nbytes
        return partner, self.s.fetch_seconds(i, j, nbytes)

    def _fetch(self, i: int, j: int) -> tuple[PartnerState, int]:
        """What island i fetches of island j's published state, and the bytes it costs."""
        return self.published[j], self.s.fetch_bytes(self.published[j])

    def _arrived(self, i: int, partner: PartnerState) -> PartnerState:
        """What island i mixes of a fetched state, the moment it mixes it (the state itself here)."""
        return partner

    def _publish(self, i: int) -> None:
        """Island i publishes its state at the end of its round."""
        self.published[i] = self.s.snapshot(self.islands[i])

    def _train(self, i: int) -> None:
        """Island i's planned round: inner steps, the partner mixed when it arrives, the outer step."""
        isl, p = self.islands[i], self.plans[i]
        for step in range(p["steps"]):
            if step == p["arrives_after"]:
                self.mixes[i] += isl.mix_arrived(self._arrived(i, p["partner"])) > 0
            isl.inner_step()
        late = p["partner"] is not None and p["arrives_after"] == p["steps"]
        weights = isl.end_round([self._arrived(i, p["partner"])] if late else [])
        self.mixes[i] += sum(w > 0 for w in weights)
        self.ended[i] = p["end"]
        self.busy[i] += p["busy"]
        self.rounds[i] += 1
        self.tokens += p["steps"] * self.s.step_tokens

    def _exchange_now(self, trained: list[int], t: float) -> float:
        """`mix_delay=0`: each island that just ended a round fetches a partner's state of the same
        round and waits for it; returns when the next rounds start."""
        fresh = {i: self.s.snapshot(self.islands[i]) for i in trained}
        views: list[PartnerState] = [fresh.get(j, self.published[j]) for j in range(self.sim.islands)]
        longest = self.s.link_seconds(self.s.state_bytes(views[0].phi.numel()), hops=2)
        for i in trained:
            if (j := self._choose(i, t)) is not None:
                isl = self.islands[i]
                fetch_s = self.s.link_seconds(nbytes := self.s.fetch_bytes(views[j]), hops=2)
                isl.mix(views[j])
                isl.begin_round()
                self.sent[j] += nbytes
                self.idle[i] += fetch_s
                longest = max(longest, fetch_s)
        return t + longest

    def _final_mix(self) -> float:
        """`final_mix`: the budget spent, every island mixes the fetch it was running or else fetches
        its next partner's last published state, if that lands within the swarm's wait; returns how
        long after the last round ended the last island was done."""
        timeout_s, done = NetworkConfig().fetch_timeout_s, max(self.ended)
        for i, isl in enumerate(self.islands):
            if self.inflight[i] is not None:
                partner, fetch_s, started = self.inflight[i]
                lands = started + fetch_s
            elif (j := self._choose(i, math.inf, final=True)) is None or not worth_fetching(self.published[j].tokens):
                continue
            else:
                partner, fetch_s = self._fetch_counted(i, j)
                lands = self.ended[i] + fetch_s
            wait = max(0.0, lands - self.ended[i])
            if final_fetch_in_time(wait, timeout_s):
                self.idle[i] += wait
                done = max(done, lands)
                self.mixes[i] += isl.mix_arrived(self._arrived(i, partner)) > 0
        return done - max(self.ended)

    def run(self) -> MethodResult:
        sim, K = self.sim, self.sim.islands
        for i in range(K):
            self._plan(i, 0.0)
        total_steps = max(1, sim.tokens // self.s.step_tokens)
        t_end = 0.0
        while True:
            t = min(p["end"] for p in self.plans)
            if t == math.inf or (sim.time_budget is not None and t > sim.time_budget):
                break
            group = [i for i in range(K) if abs(self.plans[i]["end"] - t) < 1e-9]
            trained = [i for i in group if not self.plans[i].get("offline")]
            for i in trained:
                self._train(i)
            next_t = self._exchange_now(trained, t) if sim.mix_delay == 0 and trained else t
            for i in trained:
                self._publish(i)
            t_end = t
            self.s.progress("gossip", self.tokens // self.s.step_tokens, total_steps,
                            self.islands[trained[0]].last_loss if trained else None)
            for i in group:
                self._plan(i, next_t)
        if self.dl.final_mix and sim.mix_delay == 1:
            t_end += self._final_mix()
        util = sum(self.busy) / max(1e-9, sum(self.busy) + sum(self.idle))
        result = self.s.result(self.islands, self.tokens, sum(self.sent) / K, t_end, util)
        result.mixes_per_round = sum(self.mixes) / max(1, sum(self.rounds))
        return result
