"""Top-k updates of a flat fp32 vector, per block with 4-bit values, with their exact size in bytes
(simulated only: the swarm's updates travel in the wire's `sign` or `int4`, `core.codecs`).

These carry what changed in an island's public state from one round to the next (its error feedback
keeps what a message drops for the next one, so nothing is lost over time; `p2p_diloco.sim.public`).
A message is deterministic: the sender and every receiver decode it to the same fp32 values, bit for
bit, so their copies of the public state never drift apart.

- `topk`: per block of `TOPK_BLOCK` values, the `k` of largest magnitude: their in-block indices
  (12 bits each, packed), 4-bit codes and one bf16 scale per block. With `k = 64` (1/64 of the
  values) a block costs `64 x 2 + 2 = 130` bytes: 0.032 bytes per value, 31 times fewer than int8.

The receiver always accumulates in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TOPK_BLOCK = 4096
"""Values per block of the top-k codec (indices within a block fit 12 bits)."""
LEVELS = 7
"""4-bit codes run over [-7, 7]: symmetric, so 0 is exact."""


@dataclass(frozen=True)
class Update:
    """One compressed update: what `decode_add` needs, and its size on the wire."""

    kind: str  # "topk"
    numel: int
    codes: torch.Tensor  # int8 codes, (blocks, per block)
    scales: torch.Tensor  # bf16, one per block
    index: torch.Tensor  # int64 in-block positions, (blocks, k)

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: 4-bit codes packed two per byte, 12-bit indices, bf16 scales."""
        return math.ceil(self.codes.numel() / 2) + math.ceil(self.index.numel() * 12 / 8) + 2 * self.scales.numel()


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """`x` zero-padded to whole blocks, as (blocks, block)."""
    pad = (-x.numel()) % block
    return torch.nn.functional.pad(x.float().reshape(-1), (0, pad)).view(-1, block)


def _quantize(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `v` as 4-bit codes with one bf16 scale per row. The scale is rounded up to bf16 first
    (bf16 keeps fp32's range: tiny updates do not underflow as in fp16), so that the codes are
    computed against the scale the receiver uses and none is clipped."""
    exact = v.abs().amax(dim=1) / LEVELS
    scale = exact.to(torch.bfloat16)
    low = scale.float() < exact
    scale[low] = (scale[low].view(torch.int16) + 1).view(torch.bfloat16)  # the next bf16 up (scales are >= 0)
    s = scale.float().unsqueeze(1)
    codes = torch.where(s > 0, torch.round(v / s.clamp_min(1e-30)), torch.zeros_like(v)).clamp_(-LEVELS, LEVELS)
    return codes.to(torch.int8), scale


def encode(x: torch.Tensor, kind: str, k: int = 64) -> Update:
    """Compress `x` (flat fp32) with `kind` `topk`, keeping `k` values per `TOPK_BLOCK`."""
    if kind == "topk":
        blocks = _blocks(x, TOPK_BLOCK)
        index = blocks.abs().topk(min(k, TOPK_BLOCK), dim=1, sorted=False).indices
        codes, scales = _quantize(blocks.gather(1, index))
        return Update("topk", x.numel(), codes, scales, index)
    raise ValueError(f"unknown update codec {kind!r}")


def decode_add(out: torch.Tensor, u: Update, alpha: float = 1.0) -> torch.Tensor:
    """`out += alpha * decoded(u)` in place (fp32), and return `out`."""
    values = u.codes.float() * u.scales.float().unsqueeze(1)
    dense = torch.zeros(u.codes.shape[0], TOPK_BLOCK).scatter_(1, u.index, values).reshape(-1)[: u.numel]
    return out.add_(dense.to(out.device), alpha=alpha)


def decoded(u: Update) -> torch.Tensor:
    """The update as a dense fp32 vector."""
    return decode_add(torch.zeros(u.numel), u)
