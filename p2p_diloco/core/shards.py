"""Token shards in the nanoGPT / llm.c convention, memory-mapped, and the `TokenSource` samplers read.

A shard is a `.bin` file of flat little-endian token ids, written by any tokenizer:

- headerless uint16, as nanoGPT's `prepare.py` writes `train.bin` / `val.bin` (uint32 when the
  folder's `dataset.json` says so, `core.sidecar`);
- or with llm.c's header: 256 int32 (1024 bytes) before the tokens, where header[0] is the magic,
  header[1] the version and header[2] the number of tokens. llm.c has two: magic 20240520 version 1
  for uint16 tokens (GPT-2), and magic 20240801 version 7 for uint32 tokens (its Llama 3 shards).
  `write_shard` and `ShardWriter` write the first for a vocabulary of at most 65,536 and the second
  above it.

Our own convention on top of llm.c's: llm.c leaves header[3] zero; when it is non-zero it is the
vocabulary size, so such shards need no `--vocab-size`.

A folder that `p2p-diloco prepare` wrote also holds `dataset.json` (`core.sidecar`): it names the
vocabulary (a `--vocab-size` that disagrees is an error), the token width, and which files are the
train and which the validation split.

Shards are opened with `numpy.memmap` and never read whole: a batch reads only its windows, so a
folder of many gigabytes costs no memory. Without a sidecar, files whose name contains "val" are the
validation split (nanoGPT's `val.bin`, llm.c's `*_val_*.bin`); when none does, the last tokens of
the last file are.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from p2p_diloco.core.sidecar import DataSidecar, read_sidecar
from p2p_diloco.errors import DataError

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".bin"
LLMC_MAGIC = 20240520
LLMC_VERSION = 1
"""llm.c's header for uint16 tokens (its GPT-2 shards)."""
LLMC_MAGIC_U32 = 20240801
LLMC_VERSION_U32 = 7
"""llm.c's header for uint32 tokens (its Llama 3 shards)."""
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_UINT16_VOCAB = 1 << 16
MAX_VOCAB = (1 << 31) - 1
"""The largest vocabulary a header (int32) can name; uint32 shards hold its ids."""
TOKEN_DTYPE = np.dtype("<u2")
TOKEN_DTYPE_U32 = np.dtype("<u4")
DTYPES = {"uint16": TOKEN_DTYPE, "uint32": TOKEN_DTYPE_U32}
HEADERS = {(LLMC_MAGIC, LLMC_VERSION): TOKEN_DTYPE, (LLMC_MAGIC_U32, LLMC_VERSION_U32): TOKEN_DTYPE_U32}
"""llm.c header (magic, version) -> the width of the ids after it."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest width that holds every id of the vocabulary: uint16 up to 65,536, else uint32."""
    return TOKEN_DTYPE if vocab_size <= MAX_UINT16_VOCAB else TOKEN_DTYPE_U32


def dtype_name(dtype: np.dtype) -> str:
    return "uint16" if dtype == TOKEN_DTYPE else "uint32"


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


def open_shard(path: Path, headerless: np.dtype = TOKEN_DTYPE) -> tuple[np.ndarray, int | None]:
    """A shard's tokens as a read-only memmap, and the vocabulary its llm.c header names (None if none).

    The header says the ids' width; a headerless file holds `headerless` ids (uint16 unless a
    sidecar says otherwise)."""
    try:
        size = path.stat().st_size
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS) if size >= HEADER_BYTES else None
    except OSError as e:
        raise DataError(f"cannot read token shard {path}: {e}") from e
    if size == 0:
        raise DataError(f"token shard {path} is empty")
    if header is None or int(header[0]) not in (LLMC_MAGIC, LLMC_MAGIC_U32):
        if size % headerless.itemsize:
            raise DataError(f"token shard {path} has {size} bytes, not a whole number of "
                            f"{dtype_name(headerless)} tokens")
        return np.memmap(path, dtype=headerless, mode="r"), None
    magic, version, n, vocab = (int(v) for v in header[:4])
    dtype = HEADERS.get((magic, version))
    if dtype is None:
        raise DataError(f"token shard {path} has llm.c header magic {magic} version {version}; supported: "
                        f"{LLMC_MAGIC} version {LLMC_VERSION} (uint16), {LLMC_MAGIC_U32} version {LLMC_VERSION_U32} (uint32)")
    if n <= 0 or size != HEADER_BYTES + n * dtype.itemsize:
        raise DataError(f"token shard {path}: its header says {n} tokens but the file holds "
                        f"{(size - HEADER_BYTES) / dtype.itemsize:g}")
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,)), vocab or None


def resolve_vocab(path: Path, given: int | None, from_headers: set[int], widest: np.dtype = TOKEN_DTYPE) -> int:
    """The vocabulary: the argument, else the shards' headers (which must agree); it must fit the
    shards' ids (`widest`: uint16 or uint32)."""
    if len(from_headers) > 1:
        raise DataError(f"token shards in {path} name different vocabulary sizes {sorted(from_headers)}")
    header = next(iter(from_headers), None)
    if given is None and header is None:
        raise DataError(f"token shards in {path} do not name their vocabulary size: pass --vocab-size "
                        "(e.g. 50257 for the GPT-2 tokenizer)")
    vocab = given if given is not None else header
    if header is not None and vocab != header:
        log.warning("--vocab-size %d overrides the vocabulary %d in the headers of %s", vocab, header, path)
    top = MAX_UINT16_VOCAB if widest == TOKEN_DTYPE else MAX_VOCAB
    if not 1 <= vocab <= top:
        raise DataError(f"vocabulary size {vocab} does not fit {dtype_name(widest)} token shards (1 to {top})")
    return vocab


def _sidecar_files(path: Path, sidecar: DataSidecar) -> list[Path]:
    """The shard files the sidecar lists (train, then val), each of which must be there."""
    files = [path / name for split in ("train", "val") for name in sidecar.splits.get(split, [])]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DataError(f"{path / 'dataset.json'} lists {missing[0]}, which is not in {path}"
                        + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else ""))
    if not sidecar.splits.get("train"):
        raise DataError(f"{path / 'dataset.json'} lists no train shards")
    return files


def sidecar_vocab(path: Path, sidecar: DataSidecar, given: int | None) -> int:
    """The sidecar's vocabulary; a different `given` one (`--vocab-size`) is an error."""
    if given is not None and given != sidecar.vocab_size:
        raise DataError(f"--vocab-size {given} disagrees with the vocabulary {sidecar.vocab_size} of the prepared "
                        f"data in {path} (its dataset.json): leave --vocab-size out")
    return sidecar.vocab_size


def load_shards(path: Path, vocab_size: int | None, val_fraction: float) -> tuple[TokenSource, TokenSource, int]:
    """Train and validation `TokenSource`s over the shards at `path`, and the vocabulary.

    With a sidecar (`dataset.json`, from `p2p-diloco prepare`) it names the vocabulary, the width and
    the splits. Without one, files named like "val" are held out; without one of those, the last
    `val_fraction` of the last file is.
    """
    sidecar = read_sidecar(path)
    given = sidecar_vocab(path, sidecar, vocab_size) if sidecar is not None else vocab_size
    headerless = DTYPES[sidecar.dtype] if sidecar is not None else TOKEN_DTYPE
    files = _sidecar_files(path, sidecar) if sidecar is not None and path.is_dir() else shard_files(path)
    opened = [(p, *open_shard(p, headerless)) for p in files]
    headers = {v for _, _, v in opened if v is not None}
    if sidecar is not None and headers - {sidecar.vocab_size}:
        raise DataError(f"token shards in {path} name vocabulary {sorted(headers)} in their headers but "
                        f"dataset.json says {sidecar.vocab_size}")
    widest = max((t.dtype for _, t, _ in opened), key=lambda d: d.itemsize)
    vocab = resolve_vocab(path, given, headers, widest)
    parts = [(str(p), tokens) for p, tokens, _ in opened]
    if sidecar is not None and path.is_dir():
        val_names = set(sidecar.splits.get("val", []))
        is_val = [p.name in val_names for p, _, _ in opened]
    else:
        is_val = ["val" in p.name.lower() for p, _, _ in opened]
    val = [part for v, part in zip(is_val, parts) if v]
    train = [part for v, part in zip(is_val, parts) if not v]
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


def shard_header(n_tokens: int, vocab_size: int) -> np.ndarray:
    """llm.c's 256-int32 header for `n_tokens` ids of this vocabulary (uint16 up to 65,536, else uint32),
    naming the vocabulary in header[3]."""
    u32 = token_dtype(vocab_size) == TOKEN_DTYPE_U32
    header = np.zeros(HEADER_INTS, dtype="<i4")
    magic, version = (LLMC_MAGIC_U32, LLMC_VERSION_U32) if u32 else (LLMC_MAGIC, LLMC_VERSION)
    header[:4] = magic, version, n_tokens, vocab_size
    return header


def write_shard(path: Path, tokens: np.ndarray | torch.Tensor, vocab_size: int) -> Path:
    """Write `tokens` as a shard `open_shard` reads: llm.c's header naming `vocab_size` (our header[3]),
    then the ids as little-endian uint16, or uint32 for a vocabulary above 65,536."""
    ids = np.asarray(tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens)
    if not 1 <= vocab_size <= MAX_VOCAB or ids.size == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DataError(f"token shard {path}: ids must lie in [0, {vocab_size}) and the vocabulary in [1, {MAX_VOCAB}]")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(shard_header(ids.size, vocab_size).tobytes())
        f.write(ids.astype(token_dtype(vocab_size)).tobytes())
    return path


class ShardWriter:
    """Writes one shard a piece at a time: the header first (its count patched by `close`), then the ids.

    For `prepare`, which streams more tokens than it keeps in memory. The ids must lie in the
    vocabulary (checked per piece)."""

    def __init__(self, path: Path, vocab_size: int) -> None:
        if not 1 <= vocab_size <= MAX_VOCAB:
            raise DataError(f"vocabulary size {vocab_size} is outside [1, {MAX_VOCAB}]")
        self.path, self.vocab_size, self.dtype, self.count = path, vocab_size, token_dtype(vocab_size), 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "wb")
        self.file.write(shard_header(0, vocab_size).tobytes())

    def write(self, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise DataError(f"token shard {self.path}: id {int(ids.max())} is outside the vocabulary of {self.vocab_size}")
        self.file.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        self.count += int(ids.size)

    def close(self) -> int:
        """Write the count into the header and close; the number of tokens written."""
        if not self.file.closed:
            self.file.seek(0)
            self.file.write(shard_header(self.count, self.vocab_size).tobytes())
            self.file.close()
        return self.count
