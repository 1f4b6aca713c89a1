"""Each partner's record: how its states sat and what their mixes did, over time.

One state of a member that stays inside the honest spread ("a little is enough", Baruch et al. 2019:
per coordinate, the honest mean shifted by a fraction of their spread against the swarm's progress)
or that sends a small negative multiple of the swarm's change (inner product manipulation) passes
every bound of one state. What sets it apart is over time: its states sit back along the island's
progress time after time, and their mixes raise the island's held-out loss time after time, where an
honest partner's sit at most about half a round back (a state of the same version lacks the part of
this island's last step its own did not share: -0.06 to 0.63 rounds in `bench attack`'s clean runs)
and lower the loss as often as not. Like CenteredClip's and BTARD's history term, and Templar's Gauntlet, which
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
multiplied by `slack / record`, and partner choice draws it that much less often
(`peers.gossip.partners`: the permutation partner is passed over for the draw).

One island meets a member a few times in a run, too few for a record of its own to grow (4-6 states
in `bench attack`). So each island tells its records in its discovery record (`IslandRecord.doubts`),
and reads a partner's record as the higher of its own and what the members it trusts report of that
partner (`standing`): the lower median of their reports, heard only from members whose own states
this island has mixed and found within `slack`, and none of whose reports lies farther than `agree`
from this island's own record of the same partner. Members that lie (doubting honest islands,
vouching for each other) are not heard once they contradict what this island saw itself, or once
their own states sat back, and until then move the median only where they are most of those heard.

Nothing is refused: a partner whose states come back to where honest ones sit regains its weight
within a few, and honest islands that trained apart (a link down, a partition) are mixed again at
once, held a little for a round or two at most (BENCHMARKS.md, "Link events").
"""

from __future__ import annotations

from collections.abc import Mapping

from p2p_diloco.admission import TrustSettings
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import Candidate, Island, Verdict


def standing(peer: str, ledger: PartnerLedger, members: Mapping[str, IslandRecord],
             s: TrustSettings) -> float | None:
    """`peer`'s record as this island reads it: the higher of its own and the lower median of what the
    members it hears report of `peer` (see the module docstring; None: neither has one)."""
    own = ledger.entries.get(peer)
    reports = sorted(r.doubts[peer] for pid, r in members.items()
                     if pid != peer and peer in r.doubts and _heard(pid, r, ledger, s))
    told = reports[(len(reports) - 1) // 2] if reports else None
    mine = None if own is None else own.record
    return mine if told is None else told if mine is None else max(mine, told)


def _heard(pid: str, record: IslandRecord, ledger: PartnerLedger, s: TrustSettings) -> bool:
    """Whether this island hears `pid`'s reports: its own states were found within `slack` here, and
    none of its reports lies farther than `agree` from this island's own record of that partner."""
    entry = ledger.entries.get(pid)
    if entry is None or entry.record is None or entry.record > s.slack:
        return False
    mine = ledger.entries
    return all(abs(v - mine[q].record) <= s.agree for q, v in record.doubts.items()
               if q in mine and mine[q].record is not None)


def share(record: float | None, slack: float) -> float:
    """The share of its weight a partner of `record` keeps: 1 within `slack`, `slack / record` beyond."""
    return 1.0 if record is None or record <= slack else slack / record


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
        record = standing(candidate.peer, island.ledger, island.members(), self.s)
        figures = {} if record is None else {"record": round(record, 3)}
        if cap < 1:
            figures["back"] = round(beyond, 3)
        factor = share(record, self.s.slack)
        if factor == 1.0:
            return Verdict(cap=cap, figures=figures)
        return Verdict(cap=cap, factor=factor, figures={**figures, "held": True})

    def _add(self, ledger: PartnerLedger, peer: str, evidence: float) -> None:
        entry = ledger[peer]
        entry.record = evidence if entry.record is None else self.s.memory * entry.record + (1 - self.s.memory) * evidence
