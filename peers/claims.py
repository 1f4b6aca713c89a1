"""What a partner says about itself, counted only as far as this island can check it.

A state's manifest claims a version and a count of tokens, and nothing but the member itself
vouches for them. Both weigh in a mix: the tokens set its weight (`core.outer.mixing_weight`, up
to 0.75 for a claim of 3 times this island's tokens), the version its staleness discount and the
gate's size bound (a round more for each version apart), and `core.outer.mix_counters_` takes both
into this island's own counters, which its partners read in turn. A member that serves its honest
state but claims version +1000 and tokens x1000 had every state mixed at 0.75, pushed each honest
island it reached 4 versions ahead (so its honest partners looked stale) and 2.5 times its tokens
(so it weighed them at 0.29): +2.15% on the worst honest island (BENCHMARKS.md, "The quiet
members"). `ClaimBounds` counts a claim at most:

- **version**: one version ahead of the higher of this island's own and the median of the
  training members' records (`VERSION_AHEAD`; a partner that ended its round first is one
  ahead). The members' records are each signed by their member, and one false claim cannot move
  their median; an island resumed behind the swarm still follows it (`peers.rounds._follow_swarm`
  reads the same median). A version counted lower than claimed weighs the same in a mix: a state
  at or ahead of this island's version is never discounted.
- **tokens**: `TOKEN_RATE` times the tokens this island trains in a round (its own batches, which
  no partner moves), for each version counted (at least one): a version is at most a round of
  training, and a mix averages tokens, so a partner on batches of this island's size stays within
  a round's tokens per version. A partner on larger batches counts as if its batches were
  `TOKEN_RATE` times this island's. (At 1.5 per version and one more, the member claiming x1000
  still had its first states of a run mixed at 0.69-0.75, every bound's most.)

A claim out of bounds is clipped to the bound, counted (`clipped`; the summary's
`claims_clipped`, the round's row's `claims`) and said once per partner in the log
(`peers.checks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from p2p_diloco.discovery.records import IslandRecord

VERSION_AHEAD = 1
"""Versions a partner may be counted ahead of this island and of the members' median."""
TOKEN_RATE = 1.25
"""A partner's tokens per version counted, at most, in rounds of this island's own tokens."""


def median_version(members: Mapping[str, IslandRecord]) -> int | None:
    """The median version of the training members' records (the upper one of an even count; None: none)."""
    versions = sorted(r.version for r in members.values() if r.state == "training")
    return versions[len(versions) // 2] if versions else None


class ClaimBounds:
    """Bounds on partners' claims for one island (see the module docstring)."""

    def __init__(self, swarm_median: Callable[[], int | None]) -> None:
        """`swarm_median()`: the training members' median version (`median_version`; None: no record)."""
        self.swarm_median = swarm_median
        self.round_tokens = 0
        """The most tokens this island trained in one of its rounds (0: none yet)."""
        self.clipped = 0

    def own_round(self, tokens: int) -> None:
        """One of this island's rounds ended, having trained `tokens`."""
        self.round_tokens = max(self.round_tokens, int(tokens))

    def version_bound(self, own_version: int) -> int:
        median = self.swarm_median()
        return max(own_version, own_version if median is None else median) + VERSION_AHEAD

    def count(self, own_version: int, version: int, tokens: int) -> tuple[int, int, str | None]:
        """A partner's claimed `version` and `tokens` as counted, and what was clipped (None: nothing)."""
        v = min(version, self.version_bound(own_version))
        t = tokens if not self.round_tokens else min(tokens, int(TOKEN_RATE * max(v, 1) * self.round_tokens))
        if (v, t) == (version, tokens):
            return v, t, None
        self.clipped += 1
        return v, t, ", ".join(f"{name} {claimed} counted as {counted}" for name, claimed, counted
                               in (("version", version, v), ("tokens", tokens, t)) if claimed != counted)
