"""The simulator's `gossip` method with `DiLoCoConfig(exchange="auto")`: each island publishes its
whole state and its public state's updates, and each fetch takes whichever fits the link the
island measured (`core.linkfit.LinkFit`, the choice the swarm's islands make, `peers.rounds.schedule`):
whole states from the round's permutation partner, updates from the ring successor.

As in the swarm, an island's first fetch (its first contact, `peers.gossip.fetchchoice`) takes updates from
its ring successor, and measures the link only if its data flowed for the probe's share of a round;
then it fetches whole states until one measures the link: a whole-state fetch that will not fit
the link gives way once its data has flowed for the probe (`LinkFit.give_way`), and the island
fetches updates from its ring successor at once. An island measures a link when a fetch over it
lands (or gives way): the simulated link's rate, where the swarm's islands estimate it between the
fetch's chunks (`exchange.client.FetchStats.data_bytes_per_s`). Each island's updates go in as many
fragments as its uplink calls for, as the islands that fetched from it measured it
(`LinkFit.parts`); `fetches` counts its updates by their fragments (`updates_in_<F>`).
"""

from __future__ import annotations

from p2p_diloco.core.codecs import encoded_nbytes
from p2p_diloco.core.linkfit import FIRST_CONTACT_WITHIN, PROBE_SHARE, LinkFit
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.schedule import ring_successor
from p2p_diloco.sim.gossip import GossipRun
from p2p_diloco.sim.public import UpdatesGossipRun


class AutoGossipRun(UpdatesGossipRun):
    """See the module docstring."""

    def __init__(self, simulation) -> None:
        super().__init__(simulation)
        K = self.sim.islands
        self.fits = [LinkFit() for _ in range(K)]
        self.takes_updates = [False] * K
        """What each island's current (or next) fetch takes."""
        self.source: list[int | None] = [None] * K
        """The partner of each island's running fetch."""
        self.first = [True] * K
        """Each island's next fetch is its first contact."""
        self.contact: list[int | None] = [None] * K
        """The bytes of each island's first-contact fetch, until it lands."""
        self.fetches = {"state": 0, "updates": 0, "gave_way": 0}
        self.changes = 0
        """Times an island changed what it fetches (the first choice not counted)."""
        self._now = 0.0

    def _round_s(self, i: int) -> float:
        sim = self.sim
        return min(self.round_seconds, self.dl.local_steps * sim.step_seconds / sim.speed(i))

    def _rate(self, i: int, j: int) -> float:
        """Bytes per second of island i's fetches from island j."""
        return self.s.link_mbps(i, j) * 1e6 / 8

    def _choose(self, i: int, t: float, final: bool = False) -> int | None:
        self._now = t
        return super()._choose(i, t, final)

    def _ring(self, i: int) -> bool:
        if self.first[i] and not self.fits[i].probed and self.rounds[i] <= FIRST_CONTACT_WITHIN:
            self.takes_updates[i] = True
            return True
        fit, changed = self.fits[i].choose(self.s.fetch_bytes(self.published[i]), self._round_s(i))
        self.changes += changed and self.fits[i].rate() is not None
        self.takes_updates[i] = fit.updates
        return fit.updates

    def _fetch_counted(self, i: int, j: int) -> tuple[PartnerState, float]:
        """A whole-state fetch that does not fit gives way after the probe to an updates fetch from the
        ring successor: the fetch returned is that one, its time counted from the whole state's start."""
        if self.takes_updates[i]:
            return super()._fetch_counted(i, j)
        state_bytes, round_s, rate = self.s.fetch_bytes(self.published[j]), self._round_s(i), self._rate(i, j)
        probe = PROBE_SHARE * round_s
        if not LinkFit.give_way(probe, rate, int(rate * probe), state_bytes, round_s):
            return super()._fetch_counted(i, j)
        self.fetches["gave_way"] += 1
        self.sent[j] += int(rate * probe)
        self._measured(i, j, rate)
        self._ring(i)
        online = [o for o in range(self.sim.islands) if self._online(o, self._now)]
        k = ring_successor(online, i) if self.takes_updates[i] else j
        partner, fetch_s = super()._fetch_counted(i, j if k is None else k)
        return partner, self.s.fetch_seconds(i, j, 0) + probe + fetch_s

    def _fetch(self, i: int, j: int) -> tuple[PartnerState, int]:
        self.source[i] = j
        self.fetches["updates" if self.takes_updates[i] else "state"] += 1
        if self.takes_updates[i]:
            partner, nbytes = super()._fetch(i, j)
            if self.first[i]:
                self.first[i], self.contact[i] = False, nbytes
            return partner, nbytes
        self.fetched[i] = None
        return GossipRun._fetch(self, i, j)

    def _arrived(self, i: int, partner: PartnerState) -> PartnerState:
        contact, self.contact[i] = self.contact[i], None  # a first contact measures only what a probe would
        if (j := self.source[i]) is not None and (
                contact is None or LinkFit.contact_measures(contact, self._rate(i, j), self._round_s(i))):
            self._measured(i, j, self._rate(i, j))
        return partner if self.fetched[i] is None else super()._arrived(i, partner)

    def _measured(self, i: int, j: int, rate: float) -> None:
        """Island i's fetch from j measured the link: i's choice of what to fetch hears it, and so
        does j's of its fragments (the swarm's islands read it in i's record)."""
        self.fits[i].measured(j, rate)
        self.fits[j].heard(i, rate)

    def _parts(self, i: int) -> int:
        """As many fragments as island i's uplink calls for (`LinkFit.parts`, from the rates heard)."""
        pub = self.public.senders[i].state
        parts, _ = self.fits[i].parts(encoded_nbytes(pub.pub.numel(), pub.codec), self._round_s(i),
                                      self.exchange.fragments)
        self.fetches[f"updates_in_{parts}"] = self.fetches.get(f"updates_in_{parts}", 0) + 1
        return parts

    def _publish(self, i: int) -> None:
        """Both: the public state's update and the whole state (which `published` then holds)."""
        self.public.publish(i, self.islands[i].state.phi, self._parts(i))
        GossipRun._publish(self, i)

    def run(self):
        result = super().run()
        result.fetches = {**self.fetches, "changes": self.changes}
        return result
