"""Everything an island remembers of each partner, in one place.

The checks that judge a state by its sender's past (`trust`: its record; `probe`: how many of its
mixes in a row were cut, and what the last did to the held-out loss; `drift`: its admitted move until mixed) and the admission itself (refusals, what was said
once of it) keep their memory of a partner here, in one `PartnerEntry` each. Partner choice keeps
its own backoff (`peers.gossip.partners`): when to fetch from a member again is the chooser's decision,
told by the admission.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from p2p_diloco.discovery.records import MAX_DOUBT, MAX_DOUBTS, IslandRecord

log = logging.getLogger(__name__)


@dataclass
class PartnerEntry:
    """One partner's line in the ledger."""

    refused: int = 0
    """Its states refused, in all."""
    strikes: int = 0
    """Its last mixes that the probe cut, in a row (`probe`)."""
    record: float | None = None
    """Its record: how far its states sat back beyond an honest one's and how much their mixes raised the
    held-out loss, on average (`trust`; None: nothing measured yet)."""
    probed: float | None = None
    """What the probe measured its last mix doing to the held-out loss, in the probe's tolerance (0: it
    lowered it), until its next state's record takes it in (`probe`, `trust`)."""
    pending: torch.Tensor | None = None
    """The move per unit weight of its state admitted and not yet mixed (`drift`)."""
    said: set[str] = field(default_factory=set)
    """What was said of it once in the log (a claim clipped, a momentum scaled)."""


class PartnerLedger:
    """The island's memory of its partners, by peer id (see the module docstring)."""

    def __init__(self, owner: str = "") -> None:
        self.owner = owner
        """The island's name, for its log lines."""
        self.entries: dict[str, PartnerEntry] = {}

    def __getitem__(self, peer: str) -> PartnerEntry:
        return self.entries.setdefault(peer, PartnerEntry())

    def say_once(self, peer: str, label: str, what: str, message: str) -> bool:
        """Log `message` about `peer` (shown as `label`) the first time `what` is said of it; True then."""
        said = self[peer].said
        if what in said:
            return False
        said.add(what)
        log.warning("%s: %s: %s (said once for it; counted in the summary)", self.owner, label, message)
        return True

    def doubts(self, members: Mapping[str, IslandRecord]) -> dict[str, float]:
        """The records this island tells the swarm (`IslandRecord.doubts`): the `MAX_DOUBTS` highest of
        the members among `members` (fault injection's liars read who they are), each at most `MAX_DOUBT`
        (a record has no bound: a state many rounds back adds as many)."""
        told = sorted(((e.record, peer) for peer, e in self.entries.items() if e.record is not None and peer in members),
                      reverse=True)[:MAX_DOUBTS]
        return {peer: round(min(record, MAX_DOUBT), 3) for record, peer in told}
