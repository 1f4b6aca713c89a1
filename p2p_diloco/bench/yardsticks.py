"""Yardsticks of `bench round`: what a round's pieces are judged against.

- `timed`: a call's seconds, up to the device's queued work done;
- `clone_seconds`: one fresh copy of the state (a round's overhead is judged in copies of it);
- `probe_cost`: one probe of a partner's mix (`peers.admission.probe`) against one inner step.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable


def timed(fn: Callable[[], Any], sync: Callable[[], None] = lambda: None) -> tuple[Any, float]:
    """`fn()` and its seconds, up to `sync()` (the device's queued work done)."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def probe_cost(model: Any, optimizer: Any, outer: Any, shape: dict[str, int], repeat: int = 2) -> dict[str, float]:
    """One probe of a partner's mix (`peers.admission.probe`: two evaluations and two passes over the weights)
    against one inner step (forward, backward, AdamW), both on one sequence of the model's block,
    side by side on the same model: the fastest of `repeat` each. A probe batch has as many
    sequences as a training batch (16), so `probe_vs_step` is what a mix's probe costs in inner steps."""
    import torch

    from p2p_diloco.core.device import synchronize
    from p2p_diloco.core.inner import evaluate
    from p2p_diloco.core.outer import PartnerState
    from p2p_diloco.peers.admission.probe import EffectProbe

    device = outer.state.phi.device
    sync = functools.partial(synchronize, device)
    x = torch.randint(shape["vocab_size"], (1, shape["block_size"] + 1), device=device)
    batch = [(x[:, :-1], x[:, 1:])]
    probe = EffectProbe(outer, lambda: evaluate(model, batch))
    partner = PartnerState(outer.state.phi * 1.001, None, outer.state.version, outer.state.tokens)

    def step() -> None:
        model(*batch[0])[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    probe_s = min(timed(lambda: probe.effect(partner, 0.5), sync)[1] for _ in range(repeat))
    step_s = min(timed(step, sync)[1] for _ in range(repeat))
    return {"probe_s": probe_s, "step_s": step_s, "probe_vs_step": probe_s / step_s}


def clone_seconds(phi: Any, repeat: int = 3) -> float:
    """Median seconds of one fresh `phi.clone()` (each clone freed before the next), where `phi` lives."""
    from p2p_diloco.core.device import synchronize

    times = []
    for _ in range(repeat):
        copy, s = timed(phi.clone, functools.partial(synchronize, phi.device))
        times.append(s)
        del copy
    return statistics.median(times)
