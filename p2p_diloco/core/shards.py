"""Token shards in the nanoGPT / llm.c convention, memory-mapped, and the `TokenSource` samplers read.

A shard is a `.bin` file of flat little-endian uint16 token ids, written by any tokenizer:

- headerless, as nanoGPT's `prepare.py` writes `train.bin` / `val.bin`;
- or with llm.c's header: 256 int32 (1024 bytes) before the tokens, where header[0] is the magic
  20240520, header[1] the version (1: uint16 tokens) and header[2] the number of tokens.

Our own convention on top of llm.c's: llm.c leaves header[3] zero; when it is non-zero it is the
vocabulary size, so such shards need no `--vocab-size`.

Shards are opened with `numpy.memmap` and never read whole: a batch reads only its windows, so a
folder of many gigabytes costs no memory. Files whose name contains "val" are the validation split
(nanoGPT's `val.bin`, llm.c's `*_val_*.bin`); when none does, the last tokens of the last file are.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from p2p_diloco.errors import DataError

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".bin"
LLMC_MAGIC = 20240520
LLMC_VERSION = 1
"""llm.c's header version for uint16 tokens (the only kind a uint16 shard can hold)."""
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_UINT16_VOCAB = 1 << 16
TOKEN_DTYPE = np.dtype("<u2")


class TokenSource:
    """One split of the data: one or more token arrays (memmapped shards, or a byte tensor) and the vocabulary.

    Samplers draw windows from one part at a time, so a window never crosses a shard boundary, and
    they check the window's ids against `vocab_size` because a shard cannot be checked whole cheaply.
    """

    def __init__(self, parts: list[tuple[str, np.ndarray | torch.Tensor]], vocab_size: int,
                 unit: str = "tokens") -> None:
        assert parts, "a token source needs at least one part"
        self.names = [name for name, _ in parts]
        self.arrays = [array for _, array in parts]
        self.vocab_size, self.unit = vocab_size, unit

    def lengths(self) -> list[int]:
        return [len(a) for a in self.arrays]

    def numel(self) -> int:
        return sum(self.lengths())

    def window(self, part: int, start: int, length: int) -> torch.Tensor:
        """Tokens `[start, start + length)` of one part as int64 (only these are read from disk)."""
        w = self.arrays[part][start : start + length]
        return w.long() if isinstance(w, torch.Tensor) else torch.from_numpy(w.astype(np.int64))

    def check(self, windows: torch.Tensor, parts: list[int]) -> None:
        """Raise `DataError` naming the file when a drawn window holds an id outside the vocabulary."""
        if windows.numel() == 0 or int(windows.max()) < self.vocab_size:
            return
        top = windows.amax(dim=1)  # (B,)
        i = int((top >= self.vocab_size).nonzero()[0])
        raise DataError(f"token id {int(top[i])} in {self.names[parts[i]]} is outside the vocabulary of "
                        f"{self.vocab_size}: pass the tokenizer's --vocab-size")

    def __repr__(self) -> str:
        return f"TokenSource({len(self.arrays)} part(s), {self.numel()} {self.unit}, vocab {self.vocab_size})"


def shard_files(path: Path) -> list[Path]:
    """The `.bin` files that make `path` token data: the file itself, or those under a folder (sorted)."""
    if path.is_file():
        return [path] if path.suffix.lower() == SHARD_SUFFIX else []
    return sorted(p for p in path.rglob(f"*{SHARD_SUFFIX}") if p.is_file())


def open_shard(path: Path) -> tuple[np.ndarray, int | None]:
    """A shard's tokens as a read-only memmap, and the vocabulary its llm.c header names (None if none)."""
    try:
        size = path.stat().st_size
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS) if size >= HEADER_BYTES else None
    except OSError as e:
        raise DataError(f"cannot read token shard {path}: {e}") from e
    if size == 0:
        raise DataError(f"token shard {path} is empty")
    if header is None or int(header[0]) != LLMC_MAGIC:
        if size % TOKEN_DTYPE.itemsize:
            raise DataError(f"token shard {path} has {size} bytes, not a whole number of uint16 tokens")
        return np.memmap(path, dtype=TOKEN_DTYPE, mode="r"), None
    version, n, vocab = int(header[1]), int(header[2]), int(header[3])
    if version != LLMC_VERSION:
        raise DataError(f"token shard {path} has llm.c header version {version}; only {LLMC_VERSION} "
                        "(uint16 tokens) is supported")
    if n <= 0 or size != HEADER_BYTES + n * TOKEN_DTYPE.itemsize:
        raise DataError(f"token shard {path}: its header says {n} tokens but the file holds "
                        f"{(size - HEADER_BYTES) / TOKEN_DTYPE.itemsize:g}")
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n,)), vocab or None


def resolve_vocab(path: Path, given: int | None, from_headers: set[int]) -> int:
    """The vocabulary: the argument, else the shards' headers (which must agree); it must fit uint16."""
    if len(from_headers) > 1:
        raise DataError(f"token shards in {path} name different vocabulary sizes {sorted(from_headers)}")
    header = next(iter(from_headers), None)
    if given is None and header is None:
        raise DataError(f"token shards in {path} do not name their vocabulary size: pass --vocab-size "
                        "(e.g. 50257 for the GPT-2 tokenizer)")
    vocab = given if given is not None else header
    if header is not None and vocab != header:
        log.warning("--vocab-size %d overrides the vocabulary %d in the headers of %s", vocab, header, path)
    if not 1 <= vocab <= MAX_UINT16_VOCAB:
        raise DataError(f"vocabulary size {vocab} does not fit uint16 token shards (1 to {MAX_UINT16_VOCAB})")
    return vocab


def load_shards(path: Path, vocab_size: int | None, val_fraction: float) -> tuple[TokenSource, TokenSource, int]:
    """Train and validation `TokenSource`s over the shards at `path`, and the vocabulary.

    Files named like "val" are held out; without one, the last `val_fraction` of the last file is.
    """
    opened = [(p, *open_shard(p)) for p in shard_files(path)]
    vocab = resolve_vocab(path, vocab_size, {v for _, _, v in opened if v is not None})
    parts = [(str(p), tokens) for p, tokens, _ in opened]
    val = [part for (p, _, _), part in zip(opened, parts) if "val" in p.name.lower()]
    train = [part for (p, _, _), part in zip(opened, parts) if "val" not in p.name.lower()]
    if not train:
        raise DataError(f"every token shard in {path} is a validation file (its name contains 'val'): none to train on")
    if not val:
        name, last = train.pop()
        cut = int(len(last) * (1 - val_fraction))
        if cut == 0 or cut == len(last):
            raise DataError(f"token shard {name} of {len(last)} tokens is too short to hold out a validation split")
        train.append((name, last[:cut]))
        val = [(name, last[cut:])]
    return TokenSource(train, vocab), TokenSource(val, vocab), vocab


def write_shard(path: Path, tokens: np.ndarray | torch.Tensor, vocab_size: int) -> Path:
    """Write `tokens` as a shard `open_shard` reads: llm.c's header naming `vocab_size` (our header[3]),
    then the ids as little-endian uint16."""
    ids = np.asarray(tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens)
    if not 1 <= vocab_size <= MAX_UINT16_VOCAB or ids.size == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DataError(f"token shard {path}: ids must lie in [0, {vocab_size}) and the vocabulary fit uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = LLMC_MAGIC, LLMC_VERSION, ids.size, vocab_size
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.astype(TOKEN_DTYPE).tobytes())
    return path
