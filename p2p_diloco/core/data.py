"""Byte-level training data: the embedded default corpus and user-supplied text.

With no data argument the corpus is the running interpreter's own standard-library `.py`
sources: present on every machine, no download. Files are read in sorted order of their path
relative to the stdlib root, and a file goes to the held-out split when a CRC of that relative
path falls in a fixed bucket, so the split does not depend on how many files there are.
"""

from __future__ import annotations

import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from p2p_diloco.errors import DataError

DEFAULT_MAX_BYTES = 24 * 1024 * 1024
VAL_BUCKETS = 20  # 1 file in 20 is held out
TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".text", ""}


@dataclass(frozen=True)
class Corpus:
    """Train and validation bytes as flat uint8 tensors, plus where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    source: str

    def __repr__(self) -> str:
        return f"Corpus({self.source!r}, train={self.train.numel()} bytes, val={self.val.numel()} bytes)"


def _is_val(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % VAL_BUCKETS == 0


def _stdlib_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")):
            continue
        files.append((rel, p))
    return sorted(files)


def _user_files(path: Path) -> list[tuple[str, Path]]:
    if not path.exists():
        raise DataError(f"data path {path} does not exist")
    if path.is_file():
        return [(path.name, path)]
    files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*")
                   if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise DataError(f"data folder {path} has no text files ({', '.join(sorted(s or '(none)' for s in TEXT_SUFFIXES))})")
    return files


def load_corpus(path: str | Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES, val_fraction: float = 0.05) -> Corpus:
    """Load the corpus: the stdlib sources when `path` is None, else a text file or folder.

    A single file is split by position (the last `val_fraction` held out); a folder is split by file.
    Raises `DataError` for a missing path or an empty corpus.
    """
    files = _stdlib_files() if path is None else _user_files(Path(path))
    source = "python-stdlib" if path is None else str(path)
    train, val, total = bytearray(), bytearray(), 0
    for rel, p in files:
        if total >= max_bytes:
            break
        try:
            blob = p.read_bytes()[: max_bytes - total]
        except OSError as e:
            raise DataError(f"cannot read {p}: {e}") from e
        total += len(blob)
        if len(files) == 1:
            cut = int(len(blob) * (1 - val_fraction))
            train += blob[:cut]
            val += blob[cut:]
        else:
            (val if _is_val(rel) else train).extend(blob)
    if not train or not val:
        raise DataError(f"corpus {source} is empty or too small to split into train and validation")
    return Corpus(torch.frombuffer(train, dtype=torch.uint8), torch.frombuffer(val, dtype=torch.uint8), source)


class BatchSampler:
    """Random contiguous windows of `block_size + 1` bytes from one split, from its own generator.

    Each island owns one sampler seeded from (seed, island index), so islands see different data
    and a run is reproducible from its seed.
    """

    def __init__(self, data: torch.Tensor, block_size: int, batch_size: int, seed: int) -> None:
        if data.numel() <= block_size + 1:
            raise DataError(f"split of {data.numel()} bytes is shorter than one block of {block_size + 1}")
        self.data, self.block_size, self.batch_size = data, block_size, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        B = batch_size or self.batch_size
        ix = torch.randint(self.data.numel() - self.block_size - 1, (B,), generator=self.gen)
        win = torch.stack([self.data[i : i + self.block_size + 1] for i in ix.tolist()]).long()  # (B, T+1)
        return win[:, :-1], win[:, 1:]

    def state(self) -> torch.Tensor:
        return self.gen.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


def eval_batches(val: torch.Tensor, block_size: int, n_batches: int, batch_size: int, seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of validation batches, identical for every island and method."""
    s = BatchSampler(val, block_size, batch_size, seed)
    return [s.next() for _ in range(n_batches)]
