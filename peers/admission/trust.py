"""Each partner's record: how its states sat and what their mixes did, over time.

One state of a member that stays inside the honest spread ("a little is enough", Baruch et al. 2019:
per coordinate, the honest mean shifted by a fraction of their spread against the swarm's progress)
or that sends a small negative multiple of the swarm's change (inner product manipulation) passes
every bound of one state. What sets it apart is over time: its states sit back along the island's
progress time after time, and their mixes raise the island's held-out loss time after time, where an
honest partner's sit at most about a round back (a state of the same version lacks the part of this
island's last step its own did not share: 0-0.5 rounds in `bench attack`'s clean runs) and lower the
loss as often as not. Like CenteredClip's and BTARD's history term, and Templar's Gauntlet, which
smooths each peer's score over time, the island keeps a record per partner (in its ledger): the
average over that partner's states (each keeping `memory` of the one before) of

- how far the state sat back along the island's progress (`core.influence.InfluenceBound.rounds_behind`)
  beyond its version's lag and beyond `behind` rounds (what an honest state reaches), and
- what the probe measured its mix doing to the held-out loss, in the probe's tolerance
  (`peers.admission.probe`; a mix that lowered it counts 0).

Each state is bounded on its own too, from a partner's first state on: one `x` rounds further back
than `behind` beyond its lag is mixed at `step / x` at most, so that no mix takes the island back more
than `step` rounds beyond what an honest state of its lag does (a record needs a few states to grow).
A partner whose record stays within `slack` is mixed as its state comes; beyond, its weight is
multiplied by `slack / record`. Nothing is refused: a partner whose states come back to where honest
ones sit regains its weight within a few, and honest islands that trained apart (a link down, a
partition) sit ahead as often as behind and lower each other's loss when they mix.
"""

from __future__ import annotations

from p2p_diloco.admission import TrustSettings
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import Candidate, Island, Verdict


class TrustCheck:
    """`trust`: the partners' records (see the module docstring); the probe leaves its outcome of a
    partner's mix in the ledger (`PartnerEntry.probed`), which the partner's next state takes in."""

    name = "trust"

    def __init__(self, settings: TrustSettings | None = None) -> None:
        self.s = settings or TrustSettings()

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        entry = island.ledger[candidate.peer]
        if entry.probed is not None:  # what the probe measured of its last mix (`peers.admission.probe`)
            self._add(island.ledger, candidate.peer, entry.probed)
            entry.probed = None
        m = candidate.measured
        behind = None if m is None else island.outer.influence.rounds_behind(m.along)
        beyond = 0.0
        if behind is not None:
            lag = max(0, island.outer.state.version - candidate.state.version)
            beyond = max(0.0, behind - lag - self.s.behind)
            self._add(island.ledger, candidate.peer, beyond)
        cap = 1.0 if beyond <= self.s.step else self.s.step / beyond
        figures = {} if entry.record is None else {"record": round(entry.record, 3)}
        if cap < 1:
            figures["back"] = round(beyond, 3)
        if entry.record is None or entry.record <= self.s.slack:
            return Verdict(cap=cap, figures=figures)
        return Verdict(cap=cap, factor=self.s.slack / entry.record, figures={**figures, "held": True})

    def _add(self, ledger: PartnerLedger, peer: str, evidence: float) -> None:
        entry = ledger[peer]
        entry.record = evidence if entry.record is None else self.s.memory * entry.record + (1 - self.s.memory) * evidence
