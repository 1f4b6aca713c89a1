"""What one round schedules while its inner steps run, and what an island counts of its exchanges."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Round:
    """One round's schedule while its inner steps run."""

    start: float
    """Monotonic time the round began."""
    fresh_until: float
    """Until then only a partner at this island's version (or one behind) is fetched."""
    next_try: float
    """When to look for a partner again, if no fetch runs."""
    last_announce: float
    compute_s: float = 0.0
    """Time spent in the user's inner steps this round."""
    tokens: int = 0
    """Tokens the round's inner steps trained on (the whole island's, every rank)."""
    fetching: bool = False
    arrived: dict | None = None
    """The exchange figures of a partner mixed mid-round."""
    stretch_until: float | None = None
    """Past H: when to stop training on (set once H steps are done)."""
    refused_from: list = field(default_factory=list)
    """Partners whose state was refused mid-round (the round then looks for another one)."""
    pushed_in: list = field(default_factory=list)
    """States outbound-only members pushed to this island this round: partner, weight, staleness."""
    gave_way: str | None = None
    """The partner whose whole state this round gave up for updates (`--exchange auto`)."""

    @classmethod
    def begin(cls, same_version_wait: float, last_compute_s: float) -> Round:
        """A round starting now: it waits `same_version_wait` of `last_compute_s` for a partner in step."""
        now = time.monotonic()
        return cls(start=now, fresh_until=now + same_version_wait * last_compute_s, next_try=now, last_announce=now)


@dataclass
class Tally:
    """What an island counts of its exchanges, for its record, its summary and the dashboard."""

    mixes: int = 0
    """Partner states mixed with a weight above 0."""
    bytes_in: int = 0
    """Bytes this island received: fetches, joins, catch-ups (pushes to it are the pushers')."""
    last_partner: str | None = None
    last_staleness: int | None = None
    failed: int = 0
    """Fetches that failed on the way (timeouts, lost connections; not refusals)."""
    too_stale: int = 0
    """Partner states that arrived too stale to weigh anything (more than `max_staleness` behind)."""
    fetched: dict = field(default_factory=lambda: {"state": 0, "updates": 0})
    """Fetches that brought a whole state, and public-state updates."""
