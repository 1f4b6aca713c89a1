"""A model's trainable parameters seen as one flat fp32 vector, without ever building it whole.

The outer loop works on flat vectors (anchor, momentum, partner states). Materialising the model's
weights as one more vector would cost a full copy of the state per operation, which a 124M model
cannot afford on every round; instead each operation walks the parameters in slices of at most
`CHUNK` values (`ParamSlices`), so the temporaries stay a few MiB whatever the model's size.

Only trainable parameters travel: `model.parameters()` yields a tied weight once (it travels once),
frozen parameters and buffers (integer step counters included) stay with the island.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from p2p_diloco.errors import ModelError

CHUNK = 1 << 20
"""Most values one slice of a chunked vector operation touches (4 MiB of fp32). Small enough that the
freed temporaries the allocator keeps resident stay small (16 MiB slices held ~0.1 x a 124M state more
at the peak, `bench round`), large enough that per-slice overheads vanish."""
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Name prefixes that DDP, torch.compile and FSDP add: the same model wrapped or not has one fingerprint."""


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the swarm averages; raises `ModelError` when there are none or one cannot travel."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ModelError(f"{type(model).__name__} has no trainable parameters (requires_grad=True): "
                         "there is nothing to train or exchange")
    for name, p in named_trainable(model):
        if not p.is_floating_point():
            raise ModelError(f"parameter {name!r} is {p.dtype}: only floating-point parameters can be averaged")
        if not p.is_contiguous():
            raise ModelError(f"parameter {name!r} is not contiguous; call .contiguous() on it before training")
    return params


def named_trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of each trainable parameter, wrapper prefixes removed, tied weights once."""
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            for prefix in WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            out.append((name, p))
    return out


def fingerprint(model: torch.nn.Module) -> str:
    """A short digest of the trainable parameters' names, shapes and dtypes.

    Islands only mix states whose fingerprints match: a partner running another model (or the same
    one with another vocabulary) is skipped with a log line instead of crashing the mixing step.
    """
    spec = ";".join(f"{name}:{tuple(p.shape)}:{str(p.dtype).removeprefix('torch.')}"
                    for name, p in named_trainable(model))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def weights_digest(vec: torch.Tensor, samples: int = 1 << 17) -> str:
    """16 hex digits identifying a flat vector of weights from an evenly spaced sample of its values.

    Islands of one run start from the same weights (the same seed); the digest of those initial
    weights names the run, so a state from another run of the same model is refused before mixing.
    A sample keeps it cheap at any size, and two seeds never agree on it.
    """
    step = max(1, vec.numel() // samples)
    sample = vec.detach()[::step].float().cpu().contiguous()
    return hashlib.sha256(sample.numpy().tobytes() + str(vec.numel()).encode()).hexdigest()[:16]


class ParamSlices:
    """The model's trainable parameters as consecutive slices of one virtual flat vector."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = trainable_parameters(model)
        self.numel = sum(p.numel() for p in self.params)
        self.device = self.params[0].device

    def __iter__(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, end, flat view of the parameter values [start, end)) for every slice, in order."""
        offset = 0
        for p in self.params:
            flat = p.data.view(-1)
            for i in range(0, flat.numel(), CHUNK):
                j = min(i + CHUNK, flat.numel())
                yield offset + i, offset + j, flat[i:j]
            offset += flat.numel()

    @torch.no_grad()
    def gather(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A new fp32 vector holding the parameters' values (on `device`, default theirs)."""
        out = torch.empty(self.numel, dtype=torch.float32, device=device or self.device)
        for a, b, view in self:
            out[a:b].copy_(view)
        return out

    @torch.no_grad()
    def load(self, vec: torch.Tensor) -> None:
        """Copy a flat vector (any device) into the parameters; the parameters never alias it."""
        if vec.numel() != self.numel:
            raise ModelError(f"a vector of {vec.numel()} values does not fit a model of {self.numel} parameters")
        for a, b, view in self:
            view.copy_(vec[a:b], non_blocking=True)

    @torch.no_grad()
    def add(self, shift_slice) -> None:
        """Add `shift_slice(a, b)` (a tensor of b - a values, any device) to every slice of the parameters."""
        for a, b, view in self:
            view.add_(shift_slice(a, b).to(view.device, view.dtype, non_blocking=True))
