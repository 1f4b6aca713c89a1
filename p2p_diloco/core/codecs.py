"""Payload codecs for exchanged state: fp32 (lossless), bf16, fp16, and int8 with per-block scales.

One module shared by the simulator (which counts the bytes and applies the same rounding) and the
wire (which moves the bytes), so a simulated exchange and a real one lose exactly the same
information. Encoding turns a flat fp32 tensor into one flat uint8 buffer; decoding always returns
fp32, so the receiver accumulates in full precision whatever travelled.

int8 layout: `[scales: fp32 x n_blocks][codes: int8 x numel]`, one absmax scale per block of
`INT8_BLOCK` values (symmetric, code = round(x / scale), scale = absmax / 127).
"""

from __future__ import annotations

import math

import torch

from p2p_diloco.config import CODECS
from p2p_diloco.errors import CodecError

INT8_BLOCK = 256


def check_codec(codec: str) -> str:
    """Return `codec` if it is known, else raise `CodecError` naming the choices."""
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return codec


def encoded_nbytes(numel: int, codec: str) -> int:
    """Bytes that `encode` produces for a tensor of `numel` values (what goes on the wire)."""
    check_codec(codec)
    if codec == "fp32":
        return 4 * numel
    if codec in ("bf16", "fp16"):
        return 2 * numel
    return 4 * math.ceil(numel / INT8_BLOCK) + numel


def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    """Encode a flat fp32 tensor as a flat, contiguous uint8 tensor (zero-copy for fp32)."""
    check_codec(codec)
    if x.dtype != torch.float32 or x.dim() != 1:
        raise CodecError(f"encode expects a flat float32 tensor, got {x.dtype} with shape {tuple(x.shape)}")
    x = x.detach().contiguous()
    if codec == "fp32":
        return x.view(torch.uint8)
    if codec == "bf16":
        return x.to(torch.bfloat16).view(torch.uint8)
    if codec == "fp16":
        if x.numel() and x.abs().max().item() > torch.finfo(torch.float16).max:
            raise CodecError("value out of fp16 range; use bf16 or int8 for this state")
        return x.to(torch.float16).view(torch.uint8)
    n = x.numel()
    n_blocks = math.ceil(n / INT8_BLOCK)
    padded = torch.zeros(n_blocks * INT8_BLOCK, dtype=torch.float32)
    padded[:n] = x
    blocks = padded.view(n_blocks, INT8_BLOCK)  # (n_blocks, INT8_BLOCK)
    scales = blocks.abs().amax(dim=1) / 127.0  # (n_blocks,)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8).view(-1)[:n]
    return torch.cat([scales.view(torch.uint8), codes.view(torch.uint8)])


def decode(buf: torch.Tensor | bytes | bytearray | memoryview, numel: int, codec: str) -> torch.Tensor:
    """Decode a buffer made by `encode` back to a flat fp32 tensor of `numel` values.

    Raises `CodecError` when the buffer's size does not match `numel` for this codec.
    """
    check_codec(codec)
    if not isinstance(buf, torch.Tensor):
        buf = torch.frombuffer(bytearray(buf) if isinstance(buf, bytes) else buf, dtype=torch.uint8) \
            if len(buf) else torch.empty(0, dtype=torch.uint8)
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise CodecError("decode expects a flat uint8 buffer")
    expected = encoded_nbytes(numel, codec)
    if buf.numel() != expected:
        raise CodecError(f"{codec} payload of {numel} values must be {expected} bytes, got {buf.numel()}")
    buf = buf.contiguous()
    if codec == "fp32":
        return buf.view(torch.float32).clone()
    if codec == "bf16":
        return buf.view(torch.bfloat16).float()
    if codec == "fp16":
        return buf.view(torch.float16).float()
    n_blocks = math.ceil(numel / INT8_BLOCK)
    scales = buf[: 4 * n_blocks].view(torch.float32)
    codes = buf[4 * n_blocks :].view(torch.int8).float()
    padded = torch.zeros(n_blocks * INT8_BLOCK, dtype=torch.float32)
    padded[:numel] = codes
    return (padded.view(n_blocks, INT8_BLOCK) * scales[:, None]).view(-1)[:numel].contiguous()


def roundtrip(x: torch.Tensor, codec: str) -> torch.Tensor:
    """What the receiver sees after `x` travels with `codec` (used by the simulator)."""
    if codec == "fp32":
        return x.detach().clone()
    return decode(encode(x, codec), x.numel(), codec)


def all_finite(x: torch.Tensor) -> bool:
    """True when no value of a float tensor is NaN or infinite.

    One summing pass in the common case (a finite sum proves every term finite, since NaN and
    infinities propagate); only a non-finite sum, which may also be an overflow, pays for an exact
    `isfinite` check.
    """
    if x.numel() == 0:
        return True
    if math.isfinite(x.sum(dtype=torch.float32).item()):
        return True
    return bool(torch.isfinite(x).all())


def decode_range_into(out: torch.Tensor, buf: torch.Tensor, codec: str, start: int,
                      scales: torch.Tensor | None = None) -> torch.Tensor:
    """Decode values `[start, start + n)` of one tensor into `out[start:start + n]`, from a slice.

    Lets a receiver decode chunk by chunk, without a second full-size buffer. `out` is the flat fp32
    destination; `buf` a flat uint8 slice holding the values' fp32/bf16/fp16 bytes, or, for int8,
    the values' codes, with `scales` the tensor's whole fp32 scale vector. Returns the filled view.
    Gives bit-for-bit what `decode` gives for the same values.
    """
    check_codec(codec)
    if codec == "int8":
        if scales is None:
            raise CodecError("int8 range decoding needs the tensor's scales")
        n = buf.numel()
        dst = out[start : start + n]
        dst.copy_(buf.view(torch.int8))  # codes as floats, then scaled block by block in place
        i = 0  # position in this slice
        while i < n:
            b, pos = divmod(start + i, INT8_BLOCK)
            if pos == 0 and n - i >= INT8_BLOCK:  # a run of whole blocks: one broadcast multiply
                k = (n - i) // INT8_BLOCK
                dst[i : i + k * INT8_BLOCK].view(k, INT8_BLOCK).mul_(scales[b : b + k, None])
                i += k * INT8_BLOCK
            else:  # the partial block at either end
                m = min(INT8_BLOCK - pos, n - i)
                dst[i : i + m].mul_(scales[b])
                i += m
        return dst
    width = 4 if codec == "fp32" else 2
    if buf.numel() % width:
        raise CodecError(f"{codec} slice of {buf.numel()} bytes is not a whole number of values")
    n = buf.numel() // width
    dst = out[start : start + n]
    if codec == "fp32":
        dst.view(torch.uint8).copy_(buf)
    else:
        dst.copy_(buf.view(torch.bfloat16 if codec == "bf16" else torch.float16))
    return dst
