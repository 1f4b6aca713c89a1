"""Training data: the embedded default corpus, user-supplied text, or token shards; and the batch sampler.

With no data argument the corpus is the running interpreter's own standard-library `.py`
sources: present on every machine, no download. Files are read in sorted order of their path
relative to the stdlib root, and a file goes to the held-out split when a CRC of that relative
path falls in a fixed bucket, so the split does not depend on how many files there are.

Text is read as bytes (vocabulary 256, no tokenizer). A `.bin` file, or a folder holding `.bin`
files, is token data in the nanoGPT / llm.c convention (`p2p_diloco.core.shards`), memory-mapped,
with the vocabulary from `--vocab-size` or the shards' header; a folder `p2p-diloco prepare` wrote
(`core.prepare`) names its vocabulary and splits in its `dataset.json` (`core.sidecar`).
"""

from __future__ import annotations

import logging
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from p2p_diloco.core.shards import TokenSource, load_shards, shard_files
from p2p_diloco.errors import DataError

log = logging.getLogger(__name__)

BYTE_VOCAB = 256
"""Text is read as bytes: the vocabulary is the 256 byte values."""
DEFAULT_MAX_BYTES = 24 * 1024 * 1024
VAL_BUCKETS = 20  # 1 file in 20 is held out
TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".text", ""}


@dataclass(frozen=True)
class Corpus:
    """Train and validation splits, where they came from, and the vocabulary a model needs for them.

    Bytes are flat uint8 tensors (vocabulary 256); token shards are `TokenSource`s over memmaps.
    """

    train: torch.Tensor | TokenSource
    val: torch.Tensor | TokenSource
    source: str
    vocab_size: int = BYTE_VOCAB

    def __repr__(self) -> str:
        unit = self.train.unit if isinstance(self.train, TokenSource) else "bytes"
        return (f"Corpus({self.source!r}, train={self.train.numel()} {unit}, val={self.val.numel()} {unit}, "
                f"vocab={self.vocab_size})")


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
        raise DataError(f"data folder {path} has no .bin token shards and no text files "
                        f"({', '.join(sorted(s or '(none)' for s in TEXT_SUFFIXES))})")
    return files


def load_corpus(path: str | Path | None = None, vocab_size: int | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                val_fraction: float = 0.05) -> Corpus:
    """Load the corpus: the stdlib sources when `path` is None, else token shards or a text file or folder.

    `.bin` shards (a file, or a folder holding any) take their vocabulary from `vocab_size`, else from
    their header; text is bytes, whose vocabulary is 256 whatever `vocab_size` says, so any other value
    is a mistake worth stopping for. A single text file is split by position (the last `val_fraction`
    held out); a folder is split by file. Raises `DataError` for a missing path or an empty corpus.
    """
    if path is not None and Path(path).exists() and shard_files(Path(path)):
        train, val, vocab = load_shards(Path(path), vocab_size, val_fraction)
        return Corpus(train, val, str(path), vocab)
    if vocab_size is not None and vocab_size != BYTE_VOCAB:
        raise DataError(f"--vocab-size applies to token shards; text is read as bytes ({BYTE_VOCAB})")
    return _load_bytes(path, max_bytes, val_fraction)


def _load_bytes(path: str | Path | None, max_bytes: int, val_fraction: float) -> Corpus:
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
    """Random contiguous windows of `block_size + 1` tokens from one split, from its own generator.

    Each island owns one sampler seeded from its identity, so islands see different data and a run
    is reproducible from its seed. Over several shards a window's shard is drawn with probability
    proportional to its length (its number of window starts), then the window inside it, so no window
    crosses a shard boundary.
    """

    def __init__(self, data: torch.Tensor | TokenSource, block_size: int, batch_size: int, seed: int) -> None:
        self.source = data if isinstance(data, TokenSource) else TokenSource([("bytes", data)], BYTE_VOCAB, "bytes")
        self.data, self.block_size, self.batch_size = data, block_size, batch_size
        lengths = self.source.lengths()
        if max(lengths) <= block_size + 1:
            raise DataError(f"split of {self.source.numel()} {self.source.unit} ({', '.join(self.source.names)}) "
                            f"is shorter than one block of {block_size + 1}")
        for name, n in zip(self.source.names, lengths):
            if n <= block_size + 1:
                log.warning("%s: %d %s, shorter than one block of %d: skipped", name, n, self.source.unit, block_size + 1)
        self.starts = torch.tensor([max(n - block_size - 1, 0) for n in lengths], dtype=torch.float64)  # (parts,)
        self.gen = torch.Generator().manual_seed(seed)

    def next(self, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        B = batch_size or self.batch_size
        if len(self.starts) == 1:  # one part: the draw bytes have always used (same batches for the same seed)
            parts, ix = [0] * B, torch.randint(int(self.starts[0]), (B,), generator=self.gen).tolist()
        else:
            pick = torch.multinomial(self.starts, B, replacement=True, generator=self.gen)  # (B,)
            parts = pick.tolist()
            ix = (torch.rand(B, generator=self.gen, dtype=torch.float64) * self.starts[pick]).long().tolist()
        win = torch.stack([self.source.window(p, i, self.block_size + 1) for p, i in zip(parts, ix)])  # (B, T+1)
        self.source.check(win, parts)
        return win[:, :-1], win[:, 1:]

    def state(self) -> torch.Tensor:
        return self.gen.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


def eval_batches(val: torch.Tensor | TokenSource, block_size: int, n_batches: int, batch_size: int,
                 seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of validation batches, identical for every island and method."""
    s = BatchSampler(val, block_size, batch_size, seed)
    return [s.next() for _ in range(n_batches)]
