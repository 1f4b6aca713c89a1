"""Every check there is, by the name the config orders them by (`p2p_diloco.admission.CHECKS`).

Adding a check is one class implementing `peers.admission.protocol.Check` and one entry here (its name
in `CHECKS` puts it in the default order). An entry says what the check decides, which settings
section it reads, and the figure that justifies it: docs/DESIGN.md's table of the checks is
generated from these entries (`p2p-diloco bench reference`), so that it cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from p2p_diloco.admission import AdmissionConfig
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.peers.admission.bounds import ClipCheck, IdentityCheck, MomentumCheck
from p2p_diloco.peers.admission.claims import ClaimsCheck
from p2p_diloco.peers.admission.drift import DriftCheck
from p2p_diloco.peers.admission.plausibility import PlausibilityGate
from p2p_diloco.peers.admission.probe import EffectProbe
from p2p_diloco.peers.admission.protocol import Check
from p2p_diloco.peers.admission.trust import TrustCheck

ProbeFn = Callable[[], float] | None
"""The model's loss over fixed held-out batches (`peers.admission.probe`; None: the island has no probe)."""


@dataclass(frozen=True)
class Registered:
    """One check: its class, how it is built, and what documents it."""

    kind: type
    build: Callable[[AdmissionConfig, OuterLoop, ProbeFn], Check | None]
    """The check for one island (None: the island cannot run it, as the probe without a probe batch)."""
    settings: str | None
    """The `AdmissionConfig` section holding its constants (`[admission.<settings>]` in a config file)."""
    verdict: str
    """What it decides, in a line."""
    why: str
    """The measurement that set it (BENCHMARKS.md, "Robustness")."""


REGISTRY: dict[str, Registered] = {
    "identity": Registered(
        IdentityCheck, lambda config, outer, probe_fn: IdentityCheck(), None,
        "refuses a state of another model (fingerprint) or run (initial weights' digest), and its sender for good",
        "a user who forgot to seed; another model"),
    "claims": Registered(
        ClaimsCheck, lambda config, outer, probe_fn: ClaimsCheck(config.claims), "claims",
        "counts a version at most `version_ahead` above the higher of the island's own and the members' median, "
        "tokens at most `token_rate` of the island's rounds' tokens per version",
        "a member claiming version +1000 and tokens x1000 took 0.75 of every mix (+2.15%)"),
    "momentum": Registered(
        MomentumCheck, lambda config, outer, probe_fn: MomentumCheck(), "bounds",
        "refuses a momentum beyond `momentum_ratio x D / (1 - mu)` (what honest pseudo-gradients sum to); "
        "scales one beyond `momentum_clip` x the island's own norm down to it",
        "a momentum x1e4; one x3 doubled the island's at every mix (+1.8%)"),
    "gate": Registered(
        PlausibilityGate, lambda config, outer, probe_fn: PlausibilityGate(config.gate), "gate",
        "refuses a state farther than `bound` x the island's weights (relative distance)",
        "weights x1e6, a random state, another run's: near sqrt 2 and beyond"),
    "clip": Registered(
        ClipCheck, lambda config, outer, probe_fn: ClipCheck(), "bounds",
        "caps the weight at `clip x D / gap`: a mix moves the anchor by `clip` rounds of progress at most, however "
        "far the state (self-centred clipping, as ClippedGossip and CenteredClip)",
        "an anchor x1.5, the initial weights, noise at the edge: bounded, not refused; honest islands that trained "
        "apart mix again at once"),
    "trust": Registered(
        TrustCheck, lambda config, outer, probe_fn: TrustCheck(config.trust), "trust",
        "caps a state `x` rounds further back than `behind` beyond its lag at `step / x`, from the partner's first "
        "state; multiplies the weight by `slack / record` for a partner whose record (rounds its states sat back "
        "beyond `behind`, and the rise of the held-out loss the probe measured for its mixes) exceeds `slack`, "
        "the record being the higher of its own and the lower median of what the members it hears report "
        "(`IslandRecord.doubts`; not heard: members whose states sat back, or whose reports lie beyond `agree` "
        "of its own); partner choice draws such a partner that much less",
        "\"a little is enough\" and inner product manipulation sit inside the honest spread, one state at a time, "
        "and one island meets a member too seldom for its own record to grow (4-6 states): see BENCHMARKS.md, "
        "\"Robustness: one admission\""),
    "drift": Registered(
        DriftCheck, lambda config, outer, probe_fn: DriftCheck(config.drift), "drift",
        "caps the weight so that what all partners' mixes moved the island along one direction (less its own "
        "progress; decayed by `decay` per mix) stays within `rounds` rounds; never refuses",
        "a drift growing half an honest distance a round (+1.9%); two colluding members each looked half as guilty"),
    "probe": Registered(
        EffectProbe,
        lambda config, outer, probe_fn: None if probe_fn is None else EffectProbe(outer, probe_fn, config.probe),
        "probe",
        "cuts the weight where the mix raises a held-out loss by more than `floor` (or `rounds` of the island's "
        "progress; halved for each cut in a row); refuses a mix that makes it non-finite",
        "stuck training, a reversed change: close in distance, worse in loss"),
}
"""Each check, by name, in the default order."""


def build_checks(config: AdmissionConfig, outer: OuterLoop, probe_fn: ProbeFn = None,
                 extra: Sequence[Check] = ()) -> list[Check]:
    """The checks `config` names, in its order, then `extra` (fault injection's watchers: `bench.member`)."""
    built = (REGISTRY[name].build(config, outer, probe_fn) for name in config.checks)
    return [c for c in built if c is not None] + list(extra)
