"""Payload codecs for exchanged state: fp32 (lossless), bf16, fp16, and int8, int4 or sign with per-block scales.

One module shared by the simulator (which counts the bytes and applies the same rounding) and the
wire (which moves the bytes), so a simulated exchange and a real one lose exactly the same
information. Encoding turns a flat fp32 tensor into one flat uint8 buffer; decoding always returns
fp32, so the receiver accumulates in full precision whatever travelled.

int8 layout: `[scales: fp32 x n_blocks][codes: int8 x numel]`, one absmax scale per block of
`INT8_BLOCK` values (symmetric, code = round(x / scale), scale = absmax / 127). int4 (the outer
momentum's codec by default): the same scales with absmax / 7, then two codes per byte, each stored
as code + 8 (1..15), the first value of a pair in the low nibble; an odd count ends in a pad nibble.
sign (for a momentum whose magnitude is restored after mixing): one bit per value, 1 for x >= 0,
eight to a byte from the low bit, with the block's mean |x| as its scale; value = (2 bit - 1) scale.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from p2p_diloco.config import WIRE_CODECS
from p2p_diloco.errors import CodecError

INT8_BLOCK = 256
BLOCK_CODECS = ("int8", "int4", "sign")
"""Codecs laid out as `[scales][codes]` with one scale per `INT8_BLOCK` values."""
PER_BYTE = {"int8": 1, "int4": 2, "sign": 8}
"""Values per code byte of the block codecs."""
_CODE_MAX = {"int8": 127.0, "int4": 7.0}
_SIGNS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).float() * 2 - 1
"""The eight signs (+1 for a set bit, low bit first) of each byte value: decoding `sign` is a lookup."""


def check_codec(codec: str) -> str:
    """Return `codec` if it is known, else raise `CodecError` naming the choices."""
    if codec not in WIRE_CODECS:
        raise CodecError(f"unknown codec {codec!r}; choose one of {', '.join(WIRE_CODECS)}")
    return codec


def encoded_nbytes(numel: int, codec: str) -> int:
    """Bytes that `encode` produces for a tensor of `numel` values (what goes on the wire)."""
    check_codec(codec)
    if codec == "fp32":
        return 4 * numel
    if codec in ("bf16", "fp16"):
        return 2 * numel
    return 4 * math.ceil(numel / INT8_BLOCK) + math.ceil(numel / PER_BYTE[codec])


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
    out = torch.empty(encoded_nbytes(x.numel(), codec), dtype=torch.uint8)
    _encode_chunks(out, x, codec, ENCODE_CHUNK)
    return out


ENCODE_CHUNK = INT8_BLOCK * 8 * 512
"""Values the block codecs encode at a time: their temporaries stay a few MiB, where whole-state ones
(an fp32 copy for the padding, the codes before packing) cost more in fresh pages than in arithmetic."""


def encode_difference(x: torch.Tensor, minus: torch.Tensor, codec: str) -> torch.Tensor:
    """`encode(x - minus, codec)` for flat fp32 tensors; the block codecs without the difference's
    whole-state temporary (taken a chunk at a time)."""
    if codec not in BLOCK_CODECS or x.shape != minus.shape:
        return encode(x - minus, codec)
    out = torch.empty(encoded_nbytes(x.numel(), codec), dtype=torch.uint8)
    _encode_chunks(out, x.detach(), codec, ENCODE_CHUNK, minus.detach())
    return out


def _encode_chunks(dst: torch.Tensor, flat: torch.Tensor, codec: str, chunk: int,
                   minus: torch.Tensor | None = None) -> None:
    """A block codec's encoding of the flat fp32 `flat` (less `minus`) into `dst`, `chunk` values (a
    multiple of `INT8_BLOCK`) at a time: each chunk's scales and codes go to their places in `dst`."""
    n, per_byte = flat.numel(), PER_BYTE[codec]
    n_blocks = math.ceil(n / INT8_BLOCK)
    scales, codes = dst[: 4 * n_blocks].view(torch.float32), dst[4 * n_blocks:]
    encode_chunk = _encode_signs if codec == "sign" else functools.partial(_encode_blocks, codec=codec)
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        part = flat[i:j].contiguous() if minus is None else flat[i:j] - minus[i:j]
        encode_chunk(part, scales_out=scales[i // INT8_BLOCK: math.ceil(j / INT8_BLOCK)],
                     codes_out=codes[i // per_byte: math.ceil(j / per_byte)])


def _encode_blocks(x: torch.Tensor, codec: str, scales_out: torch.Tensor, codes_out: torch.Tensor) -> None:
    """int8 or int4 of the flat fp32 `x`: its blocks' scales into `scales_out` (fp32) and its codes into
    `codes_out` (uint8), both sized for `x`."""
    n = x.numel()
    n_blocks = math.ceil(n / INT8_BLOCK)
    padded = x
    if n % INT8_BLOCK:  # (only the last block of a state is partial: no copy for the others)
        padded = torch.zeros(n_blocks * INT8_BLOCK, dtype=torch.float32)
        padded[:n] = x
    blocks = padded.view(n_blocks, INT8_BLOCK)  # (n_blocks, INT8_BLOCK)
    top = _CODE_MAX[codec]
    # the blocks' largest magnitudes without a copy of their absolute values; then the codes, in place
    torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg_(), out=scales_out).div_(top)
    safe = torch.where(scales_out > 0, scales_out, torch.ones_like(scales_out))
    codes = torch.div(blocks, safe[:, None]).round_().clamp_(-top, top)
    if codec == "int8":
        codes_out.view(torch.int8).copy_(codes.view(-1)[:n])
        return
    pairs = codes.view(-1)[: n + n % 2].add_(8).to(torch.uint8).view(torch.int16)  # 1..15 (an odd count's pad: 8)
    # each pair's two bytes as one little-endian int16: its low nibble, and the high byte's nibble above it
    codes_out.copy_(pairs.bitwise_and(0xF).bitwise_or_(pairs.bitwise_right_shift(4).bitwise_and_(0xF0)))


def _encode_signs(x: torch.Tensor, scales_out: torch.Tensor, codes_out: torch.Tensor) -> None:
    """`sign` of the flat fp32 `x`: per block of `INT8_BLOCK` its mean magnitude into `scales_out`, then a
    bit per value into `codes_out`, 1 for x >= 0 (low bit first; the padding of the last byte is 1s, as
    the zeros of a padded block would give). The bits are numpy's: its comparison and `packbits` take a
    tenth of torch's comparison and shifts."""
    m, block = x.numel(), INT8_BLOCK
    full = m // block * block
    if full:
        torch.sum(x[:full].view(-1, block).abs(), dim=1, out=scales_out[:full // block]).div_(float(block))
    if full < m:  # the last block, partial: summed as a zero-padded row, as a whole block is
        row = torch.zeros(1, block)
        row[0, :m - full] = x[full:]
        scales_out[full // block:] = row.abs().sum(dim=1) / torch.tensor([float(m - full)])
    codes_out.copy_(torch.from_numpy(np.packbits(np.greater_equal(x.cpu().numpy(), 0), bitorder="little")))
    if m % 8:
        codes_out[-1] |= (0xFF << (m % 8)) & 0xFF


def _unpack(packed: torch.Tensor, codec: str) -> torch.Tensor:
    """The codes of int8, int4 or sign bytes as signed fp32 values (before their scales), in order."""
    if codec == "int8":
        return packed.view(torch.int8).float()
    if codec == "int4":
        return torch.stack([packed & 15, packed >> 4], dim=1).view(-1).float() - 8
    return torch.nn.functional.embedding(packed.long(), _SIGNS).view(-1)  # a table lookup: 3x the bit shifts


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
    codes = buf[4 * n_blocks :]
    padded = torch.zeros(n_blocks * INT8_BLOCK, dtype=torch.float32)
    padded[:numel] = _unpack(codes, codec)[:numel]
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
                      scales: torch.Tensor | None = None, dst_start: int | None = None) -> torch.Tensor:
    """Decode values `[start, start + n)` of one tensor into `out[start:start + n]`, from a slice.

    Lets a receiver decode chunk by chunk, without a second full-size buffer. `out` is the flat fp32
    destination; `buf` a flat uint8 slice holding the values' fp32/bf16/fp16 bytes, or, for the block
    codecs, the values' codes (`start` a multiple of the values per byte; the last byte's padding is
    dropped where `out` ends), with `scales` the tensor's whole fp32 scale vector. Returns the filled view.
    Gives bit-for-bit what `decode` gives for the same values. `dst_start` writes them at
    `out[dst_start:]` instead (a destination that holds only a slice of the tensor).
    """
    at = start if dst_start is None else dst_start
    check_codec(codec)
    if codec in BLOCK_CODECS:
        if scales is None:
            raise CodecError(f"{codec} range decoding needs the tensor's scales")
        per_byte = PER_BYTE[codec]
        if start % per_byte:
            raise CodecError(f"a {codec} slice starts at a multiple of {per_byte} values")
        n = min(per_byte * buf.numel(), out.numel() - at)
        dst = out[at : at + n]
        dst.copy_(buf.view(torch.int8) if codec == "int8" else _unpack(buf, codec)[:n])  # codes, then scaled in place
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
    dst = out[at : at + n]
    if codec == "fp32":
        dst.view(torch.uint8).copy_(buf)
    else:
        dst.copy_(buf.view(torch.bfloat16 if codec == "bf16" else torch.float16))
    return dst


def encode_into(dst: torch.Tensor, x: torch.Tensor, codec: str, chunk: int = 1 << 22) -> None:
    """`encode(x, codec)` written straight into `dst` (uint8, `encoded_nbytes` long), slice by slice.

    Bit-for-bit what `encode` gives, without its full-size temporaries: publishing a large state
    costs no more memory than the published buffer itself.
    """
    check_codec(codec)
    n = x.numel()
    if dst.numel() != encoded_nbytes(n, codec):
        raise CodecError(f"{codec} buffer for {n} values must be {encoded_nbytes(n, codec)} bytes, got {dst.numel()}")
    if codec not in BLOCK_CODECS:
        if codec == "fp16" and n and x.abs().max().item() > torch.finfo(torch.float16).max:
            raise CodecError("value out of fp16 range; use bf16 or int8 for this state")
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[codec]
        dst.view(dtype).copy_(x.detach().reshape(-1))
        return
    _encode_chunks(dst, x.detach().reshape(-1), codec, chunk - chunk % INT8_BLOCK)


def rounding_error(v: "EncodedVector") -> float:
    """The expected norm of what encoding took from the values `v` holds (`|x - decode(encode(x))|`),
    from its scales alone: a block codec rounds to steps of its block's scale, an error uniform over
    a step, `scale / sqrt(12)` per value (0 for the codecs without scales)."""
    if v.codec not in ("int8", "int4"):
        return 0.0
    scales = v.buf[: 4 * math.ceil(v.total / INT8_BLOCK)].view(torch.float32).double()
    return math.sqrt(float(scales.square().sum()) * INT8_BLOCK / 12 * v.length / max(v.total, 1))


class EncodedVector:
    """A flat fp32 vector kept in its encoded bytes, decoded a slice at a time.

    What a fetched partner state is held as until it is mixed: for int8 a quarter of the fp32
    state's memory. Slicing (`v[i:j]`) is free; `.to(device)` / `.float()` decode the slice into
    fp32 (bit-for-bit what `decode` gives), so mixing walks it chunk by chunk. The bytes must have
    been checked (digests, finite values) before one is made.
    """

    def __init__(self, buf: torch.Tensor, codec: str, numel: int, start: int = 0, length: int | None = None) -> None:
        self.buf, self.codec, self.total = buf, check_codec(codec), numel
        self.start, self.length = start, numel - start if length is None else length
        self.device = buf.device
        self.dtype = torch.float32

    def numel(self) -> int:
        return self.length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> EncodedVector:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("an EncodedVector takes only contiguous slices")
        i, j, _ = key.indices(self.length)
        return EncodedVector(self.buf, self.codec, self.total, self.start + i, max(0, j - i))

    def float(self) -> torch.Tensor:
        out = torch.empty(self.length, dtype=torch.float32)
        a, b = self.start, self.start + self.length
        if self.codec in BLOCK_CODECS:
            n_blocks = math.ceil(self.total / INT8_BLOCK)
            scales, codes = self.buf[: 4 * n_blocks].view(torch.float32), self.buf[4 * n_blocks :]
            per = PER_BYTE[self.codec]
            lead = a % per  # a slice decodes from the first value of its byte
            wide = torch.empty(self.length + lead, dtype=torch.float32) if lead else out
            decode_range_into(wide, codes[(a - lead) // per : -(-b // per)], self.codec, a - lead, scales=scales,
                              dst_start=0)
            return wide[lead:]
        width = 4 if self.codec == "fp32" else 2
        return decode_range_into(out, self.buf[width * a : width * b], self.codec, a, dst_start=0)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> torch.Tensor:
        out = self.float()
        return out if device is None else out.to(device, non_blocking=non_blocking)
