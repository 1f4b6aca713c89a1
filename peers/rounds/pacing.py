"""Round pacing: how long an island that runs ahead trains past its H steps so its rounds end with the others'.

Islands never wait for each other, so they drift out of phase: one machine is a few percent
faster, one island started a second later. A round's partner state should be current, one
published at the end of the partner's previous round, as in the simulator, where islands run in
step. The island that runs ahead instead found no partner at its version when its round began,
waited for one through half of its round and mixed it late, round after round (BENCHMARKS.md,
Swarm). Pacing lets it train on instead, for as long as the others are behind, so the phases
come together; it never idles, and a truly slow island is outvoted (the median decides).

The phase of an island is the time it last published (`IslandRecord.published_at`): a round ends
with a publish.
"""

from __future__ import annotations

from p2p_diloco.discovery.records import IslandRecord


def phase_offset(theirs: float, ours: float, period: float) -> float:
    """How long after us (positive) or before us (negative) another island publishes, in
    `[-period/2, period/2)`, given that both publish every `period` seconds."""
    return (theirs - ours + period / 2) % period - period / 2


def catch_up_seconds(members: dict[str, IslandRecord], self_id: str, published_at: float, now: float,
                     fresh_s: float) -> float:
    """Seconds this island should train past the end of its round so that it ends with the others.

    Called when the round's H steps are done, at unix time `now`; `published_at` is when this
    island published last, so `now - published_at` is its round's length. Each other live island's
    offset is how long after this one it publishes; the answer is the lower median of the offsets,
    when it is positive (most of the others are behind), else 0 (this island is not ahead).
    Records older than `fresh_s` are not counted: a dead island's record lingers until it expires.
    """
    period = now - published_at
    if published_at <= 0 or period <= 0:
        return 0.0
    offsets = sorted(phase_offset(r.published_at, published_at, period) for pid, r in members.items()
                     if pid != self_id and r.state == "training" and r.published_at > 0
                     and now - r.timestamp <= fresh_s)
    if not offsets:
        return 0.0
    return max(0.0, offsets[(len(offsets) - 1) // 2])
