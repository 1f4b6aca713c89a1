"""Decisions the swarm's islands and the simulator make alike, written once.

The island drives them by its clock and sockets (`peers.gossip.partners`, `peers.rounds.schedule`), the simulator
by its virtual clock (`sim.gossip`). The mixing itself (when an arrived state is mixed, the mix's
arithmetic, the outer step, the final mix) is `core.island.OuterLoop`'s, which both drive.
docs/DESIGN.md, section 2.5.2, lists what the two still decide differently, and why.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import TypeVar

Id = TypeVar("Id", int, str)

SHIFT_STRIDE = 7919
"""The shift of round r is drawn from `salt * SHIFT_STRIDE + r` (a prime: the salts of different
runs do not overlap for any realistic round count)."""

FINAL_MIX_WAIT_S = 5.0
"""The final mix waits at least this long for a partner in step with the island (`peers.rounds.schedule`),
then for the fetch as long as the fetch timeout allows."""


def final_fetch_in_time(wait_s: float, fetch_timeout_s: float) -> bool:
    """Whether the final mix still takes a fetch that ends `wait_s` after the island's budget was
    spent: one that needs longer than `FINAL_MIX_WAIT_S` plus the fetch timeout is abandoned."""
    return wait_s <= FINAL_MIX_WAIT_S + fetch_timeout_s


def worth_fetching(tokens: int) -> bool:
    """A partner that has trained nothing holds the initial weights every island starts from:
    fetching it would mix nothing in (the first round of a run mixes nothing)."""
    return tokens > 0


def ring_successor(ids: Iterable[Id], own: Id) -> Id | None:
    """The partner of `own` on the ring (`Exchange.ring`, with updates): the next of the candidate
    `ids` after `own` in sorted order, wrapping around; None when there is no other. A receiver of
    updates then stays at most one update behind its one sender."""
    others = sorted(i for i in ids if i != own)
    return next((i for i in others if i > own), others[0]) if others else None


def shifted_partner(ids: Iterable[Id], own: Id, round_index: int, salt: int = 0) -> Id | None:
    """The partner of `own` in round `round_index`'s permutation (with whole states): every member
    (`ids` and `own`, in sorted order) fetches from the one a shift further, the shift drawn from
    `salt` and the round in 1..K-1, so islands in step each serve one fetch, and no upload carries
    two while another carries none. None when `own` is alone."""
    order = sorted(set(ids) | {own})
    if len(order) < 2:
        return None
    shift = 1 + random.Random(salt * SHIFT_STRIDE + round_index).randrange(len(order) - 1)
    return order[(order.index(own) + shift) % len(order)]
