"""What a user's loop reads back from the island: the figures `figures()` returns (`Figures`, every
field and its sign). What `step()` takes is `peers.rounds.losses`.

Kept apart from `peers.island`, whose facade only returns these: the island does the work, this
module says what the numbers at its edge are.
"""

from __future__ import annotations

from typing import TypedDict


class Figures(TypedDict):
    """`SwarmIsland.figures()`: the island's figures now, what the dashboard shows of it. Counts are
    since this process started the island (a resumed island's `round` and `tokens` come back with
    its checkpoint)."""

    peer_id: str
    """The island's discovery peer id."""
    name: str
    """Its label (`IslandConfig.name`, else the peer id's first 8 characters)."""
    version: int
    """Outer steps of its state: its own, plus those it took over from partners ahead of it."""
    round: int
    """Rounds this island finished."""
    tokens: int
    """Tokens this island (all its ranks) trained on in finished rounds."""
    partner: str | None
    """Peer id of the last partner whose fetched state was mixed in (None before the first mix)."""
    staleness: int | None
    """At that mix, this island's version minus the partner's: positive, the partner's state was that
    many outer steps behind (it weighs less, nothing from `max_staleness + 1`); 0, in step; negative,
    the partner was ahead (it weighs in full; -1 is common: the partner had already taken this
    round's outer step). None before the first mix."""
    mixes: int
    """Partner states mixed with a weight above 0 (fetched or pushed)."""
    refused: int
    """Partner states refused by the checks before mixing (wrong model or run, implausible, too far)."""
    failed_fetches: int
    """Fetches that failed on the way (timeouts, lost connections; not refusals)."""
    too_stale: int
    """Partner states that arrived more than `max_staleness` versions behind (weighed 0)."""
    alone: str | None
    """Why the island trains alone (no partner mixed for a while), None while it does not."""
    fetches: str
    """What `--exchange auto` fetches now and why ("" with a fixed exchange)."""
    bytes_in: int
    """Bytes received: fetches, joins, catch-ups."""
    bytes_out: int
    """Bytes sent: states served to partners, plus states pushed."""
    loss: float | None
    """The loss last passed to `step()` (None before one, or while it is not finite)."""
    eval_loss: float | None
    """The last `eval_fn()` result (None without `eval_fn`)."""
    state: str
    """`joining`, `syncing` (downloading the swarm's state), `training` or `leaving`."""
    reach: str
    """`direct` (others can dial it) or `outbound` (it fetches and pushes, nobody dials it)."""
