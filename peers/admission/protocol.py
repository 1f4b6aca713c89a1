"""The one interface every check of a partner's state implements, and what the admission returns.

A check reads a `Candidate` (the state as it arrived, its claims as counted so far, what was
measured of it on the gossip worker's thread, the weight the checks before it allow) and what the
island knows (`Island`), and returns one `Verdict`: refuse with a reason, or limit the weight (a
`cap` on it, a `factor` on it), scale the momentum, count the claims, and report figures for the
round's row. The admission (`peers.admission.admission`) folds the verdicts in order: the first
refusal wins, caps and factors take the smallest, and returns one typed `Outcome`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from p2p_diloco.core.outer import PartnerState

if TYPE_CHECKING:
    from p2p_diloco.core.island import OuterLoop
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.exchange.client import Snapshot
    from p2p_diloco.peers.admission.ledger import PartnerLedger
    from p2p_diloco.peers.gossip.measure import Measured
    from p2p_diloco.peers.identity import Identity

Figure = float | int | str | bool
"""A value of the round's row (`metrics.jsonl`)."""


@dataclass(frozen=True)
class Verdict:
    """One check's word on one state."""

    refused: str | None = None
    """Why the state is not mixed (None: it may be)."""
    cap: float = 1.0
    """The most weight it may be mixed with."""
    factor: float = 1.0
    """A factor on the weight the checks before allowed (`probe`)."""
    momentum_scale: float = 1.0
    """A factor on its momentum."""
    counted: tuple[int, int] | None = None
    """Its version and tokens as counted (None: as claimed, or as counted before)."""
    figures: Mapping[str, Figure] = field(default_factory=dict)
    """What the check measured, for the round's row."""
    never_again: bool = False
    """Its sender is never chosen again (another model or run: it never changes)."""
    far: bool = False
    """Far from this island: when it is also far ahead, this island may be the stale one (a catch-up)."""
    foreign: str | None = None
    """Refused as `model` or `run`: another model's, or another run's (`ForeignState.kind`)."""


ADMIT = Verdict()
"""A check's verdict when it has nothing against the state."""


@dataclass
class Candidate:
    """A partner's state while the checks run."""

    peer: str
    snapshot: Snapshot
    state: PartnerState | None = None
    """The mixable state (None until `identity` passed: nothing reads a state of another model)."""
    measured: Measured | None = None
    """What its arrival measured against this island's state (None: not measured, e.g. the API's
    islands without a gossip worker's measure)."""
    weight: float = 0.0
    """The weight the checks so far allow (the base weight, `core.outer.mixing_weight`, at first)."""


@dataclass(frozen=True)
class Island:
    """What the checks know of the island that admits: its outer loop, the per-partner ledger, the
    members' records, its progress per round `D` (`OuterLoop.progress`, taken once per state)."""

    outer: OuterLoop
    ledger: PartnerLedger
    identity: Identity
    members: Callable[[], Mapping[str, IslandRecord]]
    progress: float | None


@runtime_checkable
class Check(Protocol):
    """A check of a partner's state (see the module docstring)."""

    name: str

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        """This check's verdict on `candidate`."""
        ...


@runtime_checkable
class Remembers(Protocol):
    """A check with memory of the island's own rounds or of what was mixed (`claims`, `drift`)."""

    def mixed(self, peer: str, weight: float, ledger: PartnerLedger) -> None:
        """`peer`'s admitted state was weighed, and mixed with `weight` (0: it was not)."""
        ...

    def own_round(self, tokens: int) -> None:
        """One of this island's rounds ended, having trained `tokens`."""
        ...


@dataclass(frozen=True)
class Admitted:
    """Mix `state` with `weight` (decided here, once)."""

    state: PartnerState
    weight: float
    figures: dict


@dataclass(frozen=True)
class Refused:
    reason: str
    figures: dict
    foreign: str | None = None
    """`model` or `run` when it was another model's or run's."""


@dataclass(frozen=True)
class Cancelled:
    """This island gave the exchange up (`--exchange auto`): no fault of the partner's."""

    figures: dict


@dataclass(frozen=True)
class Failed:
    """The exchange failed on its way (silence, a closed connection): the partner backs off."""

    error: str
    figures: dict


Outcome = Admitted | Refused | Cancelled | Failed
