"""Patient joining: an island whose bootstrap nodes do not answer yet keeps trying.

An island started before its bootstrap node, or one of many joining a node at once, would give up
after one `connect_timeout`. `keep_trying` runs the attempt again, after pauses that double from
`FIRST_PAUSE_S` up to `MAX_PAUSE_S`, each cut by a random share (jitter: a storm of joiners spreads
out), until a bootstrap node answers, `limit_s` passes (`DiscoveryConfig.join_timeout`, else the
island's `max_seconds`) or `stopped()` says the island was asked to stop. It says so once, then
again each time the wait has doubled. Only `BootstrapUnanswered` is retried: any other error is
the user's to see at once.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, TypeVar

from p2p_diloco.errors import BootstrapUnanswered, JoinStopped

logger = logging.getLogger(__name__)
T = TypeVar("T")

Patiently = Callable[[Callable[[float | None], Any]], Any]
"""`keep_trying` with an island's limits bound: how it repeats a try of its bootstrap nodes."""
FIRST_PAUSE_S = 1.0
"""Pause after the first unanswered attempt (doubling after each one)."""
MAX_PAUSE_S = 20.0
"""Longest pause between two attempts."""
JITTER = 0.5
"""Each pause is cut by a random share of up to this much."""
FIRST_NOTE_S = 15.0
"""After the first warning, the next comes once the wait is twice this long, then at each doubling."""
STOP_POLL_S = 0.1
"""How often a pause checks `stopped()`."""


def try_timeout(connect_timeout: float, time_left: float | None) -> float:
    """How long one try waits: `connect_timeout`, cut to the `time_left` of the limit."""
    return connect_timeout if time_left is None else min(connect_timeout, time_left)


def keep_trying(attempt: Callable[[float | None], T], *, limit_s: float | None, stopped: Callable[[], bool],
                rng: random.Random | None = None, first_pause_s: float = FIRST_PAUSE_S) -> T:
    """`attempt(time_left)` until it does not raise `BootstrapUnanswered` (see the module docstring).

    `time_left` is None without a limit, else the seconds left, for the attempt to wait at most that
    long. Raises `BootstrapUnanswered` naming the limit when it passed, `JoinStopped` when
    `stopped()` turned True during a pause."""
    rng = rng or random.Random()
    start = time.monotonic()
    deadline = None if limit_s is None else start + limit_s
    tries, pause, note_at = 0, first_pause_s, None
    while True:
        try:
            return attempt(None if deadline is None else max(deadline - time.monotonic(), 0.01))
        except BootstrapUnanswered as e:
            tries, elapsed, last = tries + 1, time.monotonic() - start, e
        if note_at is None:
            bound = (f"for at most {limit_s:g} s" if limit_s is not None
                     else "until one does ([discovery] join_timeout bounds this)")
            logger.warning("%s; trying again, with pauses, %s", last, bound)
            note_at = 2 * max(elapsed, FIRST_NOTE_S)
        elif elapsed >= note_at:
            logger.warning("still no bootstrap node after %.0f s (%s); trying on", elapsed, _tries(tries))
            note_at = 2 * elapsed
        wait = pause * (1 - JITTER * rng.random())
        until = time.monotonic() + (wait if deadline is None else min(wait, deadline - time.monotonic()))
        while not stopped():
            if (left := until - time.monotonic()) <= 0:
                break
            time.sleep(min(STOP_POLL_S, left))
        else:
            raise JoinStopped(f"stopped while waiting for a bootstrap node ({_tries(tries)})")
        if deadline is not None and time.monotonic() >= deadline:
            raise BootstrapUnanswered(f"no bootstrap node answered within the join timeout of {limit_s:g} s "
                                      f"({_tries(tries)}; the last: {last})") from last
        pause = min(MAX_PAUSE_S, 2 * pause)


def _tries(n: int) -> str:
    return f"{n} {'try' if n == 1 else 'tries'}"
