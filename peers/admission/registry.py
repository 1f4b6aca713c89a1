"""Every check there is, by the name the config orders them by (`p2p_diloco.admission.CHECKS`).

Adding a check is one class implementing `peers.admission.protocol.Check` and one line here (its name
in `CHECKS` puts it in the default order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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

REGISTRY: dict[str, Callable[[AdmissionConfig, OuterLoop, ProbeFn], Check | None]] = {
    "identity": lambda config, outer, probe_fn: IdentityCheck(),
    "claims": lambda config, outer, probe_fn: ClaimsCheck(config.claims),
    "momentum": lambda config, outer, probe_fn: MomentumCheck(),
    "gate": lambda config, outer, probe_fn: PlausibilityGate(config.gate),
    "clip": lambda config, outer, probe_fn: ClipCheck(),
    "trust": lambda config, outer, probe_fn: TrustCheck(config.trust),
    "drift": lambda config, outer, probe_fn: DriftCheck(config.drift),
    "probe": lambda config, outer, probe_fn: None if probe_fn is None else EffectProbe(outer, probe_fn, config.probe),
}
"""Each check's factory (None: the island cannot run it, as the probe without a probe batch)."""


def build_checks(config: AdmissionConfig, outer: OuterLoop, probe_fn: ProbeFn = None,
                 extra: Sequence[Check] = ()) -> list[Check]:
    """The checks `config` names, in its order, then `extra` (fault injection's watchers: `bench.member`)."""
    built = (REGISTRY[name](config, outer, probe_fn) for name in config.checks)
    return [c for c in built if c is not None] + list(extra)
