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
  their median; an island resumed behind the swarm still follows it (`peers.rounds.schedule._follow_swarm`
  reads the same median). A version counted lower than claimed weighs the same in a mix: a state
  at or ahead of this island's version is never discounted.
- **tokens**: `TOKEN_RATE` times the tokens this island trains in a round (its own batches, which
  no partner moves), for each version counted (at least one): a version is at most a round of
  training, and a mix averages tokens, so a partner on batches of this island's size stays within
  a round's tokens per version. A partner on larger batches counts as if its batches were
  `TOKEN_RATE` times this island's. (At 1.5 per version and one more, the member claiming x1000
  still had its first states of a run mixed at 0.69-0.75, every bound's most.)

A claim out of bounds is clipped to the bound, counted (`clipped`; the summary's
`claims_clipped`, the round's row's `claims`) and said once per partner in the log.
`VERSION_AHEAD` and `TOKEN_RATE` are `p2p_diloco.admission.ClaimsSettings`' `version_ahead` and
`token_rate`.
"""

from __future__ import annotations

from collections.abc import Mapping

from p2p_diloco.admission import ClaimsSettings
from p2p_diloco.discovery.records import IslandRecord, label_among
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.protocol import ADMIT, Candidate, Island, Verdict


def median_version(members: Mapping[str, IslandRecord]) -> int | None:
    """The median version of the training members' records (the upper one of an even count; None: none)."""
    versions = sorted(r.version for r in members.values() if r.state == "training")
    return versions[len(versions) // 2] if versions else None


class ClaimsCheck:
    """`claims`: bounds on partners' claims for one island (see the module docstring)."""

    name = "claims"

    def __init__(self, settings: ClaimsSettings | None = None) -> None:
        self.s = settings or ClaimsSettings()
        self.round_tokens = 0
        """The most tokens this island trained in one of its rounds (0: none yet)."""
        self.clipped = 0

    def own_round(self, tokens: int) -> None:
        self.round_tokens = max(self.round_tokens, int(tokens))

    def mixed(self, peer: str, weight: float, ledger: PartnerLedger) -> None:
        pass

    def version_bound(self, own_version: int, median: int | None) -> int:
        return max(own_version, own_version if median is None else median) + self.s.version_ahead

    def count(self, own_version: int, version: int, tokens: int, median: int | None) -> tuple[int, int, str | None]:
        """A partner's claimed `version` and `tokens` as counted, and what was clipped (None: nothing);
        `median`: the training members' median version (`median_version`; None: no record)."""
        v = min(version, self.version_bound(own_version, median))
        t = tokens if not self.round_tokens else min(tokens, int(self.s.token_rate * max(v, 1) * self.round_tokens))
        if (v, t) == (version, tokens):
            return v, t, None
        self.clipped += 1
        return v, t, ", ".join(f"{name} {claimed} counted as {counted}" for name, claimed, counted
                               in (("version", version, v), ("tokens", tokens, t)) if claimed != counted)

    def judge(self, candidate: Candidate, island: Island) -> Verdict:
        state, members = candidate.state, island.members()
        v, t, clipped = self.count(island.outer.state.version, state.version, state.tokens, median_version(members))
        if clipped is None:
            return ADMIT
        island.ledger.say_once(candidate.peer, label_among(members, candidate.peer), "claims",
                               f"it claims more than this island can check ({clipped}; versions at most "
                               f"{self.s.version_ahead} ahead of the members' median, tokens at most "
                               f"{self.s.token_rate:g} of this island's rounds per version): counted as clipped")
        return Verdict(counted=(v, t), figures={"claims": clipped})
