"""`p2p-diloco prepare`: text into token shards, a train and a validation split, and their sidecar.

The text (`core.textsource`) is tokenized in batches of about `BATCH_CHARS` characters
(`encode_batch`: the `tokenizers` package spreads a batch over the CPU's cores), the
end-of-document id appended after each document when the tokenizer has one, and written as llm.c
shards (`core.shards.ShardWriter`: uint16 ids up to a vocabulary of 65,536, uint32 above) of at most
`shard_tokens` each: `OUT/train_000.bin`, ..., `OUT/val_000.bin`, ... Then the tokenizer is saved
as `OUT/tokenizer.json` and the sidecar `OUT/dataset.json` (`core.sidecar`) written last, so a
folder with a sidecar is complete.

The split goes piece by piece (a document, or 64 KiB of a large file): a piece is held out when
the validation split stays within `val_fraction` of the tokens with it, or within `MIN_VAL_TOKENS`
(a few blocks to evaluate on) and a tenth of them. When no piece was (too little text for one to
fit), the last `val_fraction` of the train tokens (at least `MIN_VAL_TOKENS`, or a tenth of a
smaller text) are moved to `val_000.bin`.

An output folder that already holds shards, a sidecar or a tokenizer is refused unless `force`;
the new files are written into a staging folder inside it and replace those (and only those) once
all of them are written. A run that fails leaves the folder as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Protocol

import numpy as np

from p2p_diloco.core.shards import (
    HEADER_BYTES, SHARD_SUFFIX, ShardWriter, dtype_name, open_shard, shard_header, token_dtype, write_shard
)
from p2p_diloco.core.sidecar import SIDECAR_NAME, DataSidecar, write_sidecar
from p2p_diloco.core.textsource import Piece, TextInput, TextStream, open_text
from p2p_diloco.core.tokenizer import (
    TOKENIZER_FILE, TextTokenizer, TokenizerSpec, load_tokenizer, train_tokenizer
)
from p2p_diloco.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BATCH_CHARS = 8 << 20
"""Text per `encode_batch` call: enough to keep every core busy, little enough to stay out of memory."""
DEFAULT_SHARD_TOKENS = 100_000_000
"""llm.c's shard size (200 MB of uint16)."""
DEFAULT_VAL_FRACTION = 0.01
MIN_VAL_TOKENS = 4096
"""A validation split held out of the tail has at least this many tokens (a few blocks to evaluate on)."""
DEFAULT_TRAIN_SAMPLE_CHARS = 256 << 20
"""A trained tokenizer learns from at most this much of the text (its first part)."""


@dataclass(frozen=True)
class PrepareConfig:
    """Where the shards go and how they are cut. `max_chars` stops after about that much text."""

    out_dir: Path
    val_fraction: float = DEFAULT_VAL_FRACTION
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    max_chars: int | None = None
    train_sample_chars: int = DEFAULT_TRAIN_SAMPLE_CHARS
    force: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.val_fraction < 0.5:
            raise ConfigError(f"--val-fraction must be in (0, 0.5), got {self.val_fraction}")
        if self.shard_tokens < 1:
            raise ConfigError(f"--shard-tokens must be at least 1, got {self.shard_tokens}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ConfigError(f"--max-mb must be positive, got {self.max_chars / 1e6}")


@dataclass(frozen=True)
class PrepareResult:
    sidecar: DataSidecar
    path: Path
    """The sidecar's file."""
    chars: int
    """Characters of text tokenized."""
    seconds: float


class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(stream: TextStream, on: bool) -> Progress:
    """tqdm's bar on stderr when `on` and stderr is a terminal (and tqdm is installed)."""
    if not on or not sys.stderr.isatty():
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=stream.total, unit=stream.unit, unit_scale=stream.unit == "B", file=sys.stderr,
                desc="tokenizing")


def existing_output(out_dir: Path) -> list[Path]:
    """The files of a previous `prepare` in `out_dir`: shards, sidecar, tokenizer."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if p.is_file() and
                  (p.suffix.lower() == SHARD_SUFFIX or p.name in (SIDECAR_NAME, TOKENIZER_FILE)))


def check_output(out_dir: Path, force: bool) -> list[Path]:
    """The files `force` will replace; `DataError` when there are some and no `force`, or `out_dir` is a file."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"output {out_dir} is a file, not a folder")
    old = existing_output(out_dir)
    if old and not force:
        raise DataError(f"output folder {out_dir} already holds token data ({len(old)} file(s): {old[0].name}, ...): "
                        "pass --force to replace it, or choose another folder")
    return old


def _limit(pieces: Iterable[Piece], max_chars: int | None) -> Iterator[Piece]:
    seen = 0
    for piece in pieces:
        if max_chars is not None and seen >= max_chars:
            return
        seen += len(piece.text)
        yield piece


def _batches(pieces: Iterable[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    chars = 0
    for piece in pieces:
        batch.append(piece)
        chars += len(piece.text)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


class _SplitWriter:
    """One split's shards, `PREFIX_000.bin`, ..., a new one every `shard_tokens` tokens."""

    def __init__(self, out_dir: Path, prefix: str, vocab_size: int, shard_tokens: int) -> None:
        self.out_dir, self.prefix, self.vocab, self.shard_tokens = out_dir, prefix, vocab_size, shard_tokens
        self.files: list[str] = []
        self.counts: list[int] = []
        self.writer: ShardWriter | None = None
        self.total = 0

    def write(self, ids: np.ndarray) -> None:
        while ids.size:
            if self.writer is None:
                path = self.out_dir / f"{self.prefix}_{len(self.files):03d}{SHARD_SUFFIX}"
                self.writer = ShardWriter(path, self.vocab)
            room = self.shard_tokens - self.writer.count
            self.writer.write(ids[:room])
            self.total += min(room, ids.size)
            ids = ids[room:]
            if self.writer.count >= self.shard_tokens:
                self._close()

    def _close(self) -> None:
        if self.writer is not None:
            self.counts.append(self.writer.close())
            self.files.append(self.writer.path.name)
            self.writer = None

    def close(self) -> None:
        self._close()


def _hold_out_tail(train: _SplitWriter, val: _SplitWriter, fraction: float) -> None:
    """Move the last `fraction` of the train tokens, at least `MIN_VAL_TOKENS` (a tenth of a small text)
    and at most all but one of its last shard, to `val_000.bin`."""
    last = train.out_dir / train.files[-1]
    n = train.counts[-1]
    k = min(max(1, int(train.total * fraction), min(MIN_VAL_TOKENS, train.total // 10)), n - 1)
    if k < 1:
        raise DataError(f"too little text to hold out a validation split ({train.total} token(s))")
    tokens, _ = open_shard(last)
    tail = np.array(tokens[n - k:])
    del tokens
    held_out = val.out_dir / f"{val.prefix}_000{SHARD_SUFFIX}"
    write_shard(held_out, tail, val.vocab)
    with open(last, "r+b") as f:
        f.write(shard_header(n - k, train.vocab).tobytes())
        f.truncate(HEADER_BYTES + (n - k) * token_dtype(train.vocab).itemsize)
    train.counts[-1], train.total = n - k, train.total - k
    val.files, val.counts, val.total = [held_out.name], [k], k


def _tokenizer(spec: TokenizerSpec, stream: TextStream, cfg: PrepareConfig) -> TextTokenizer:
    tok = load_tokenizer(spec)
    if tok is not None:
        return tok
    assert spec.train_vocab is not None
    log.info("training a byte-level BPE of %d tokens on up to %d characters", spec.train_vocab, cfg.train_sample_chars)
    texts = (p.text for p in _limit(stream.pieces, min(cfg.train_sample_chars, cfg.max_chars or cfg.train_sample_chars)))
    return train_tokenizer(texts, spec.train_vocab, progress=cfg.progress and sys.stderr.isatty())


def prepare(inp: TextInput, spec: TokenizerSpec, cfg: PrepareConfig) -> PrepareResult:
    """Tokenize `inp` with the tokenizer `spec` names into shards and a sidecar in `cfg.out_dir`.

    Raises `DataError` / `ConfigError` (one line each) for bad input, a bad tokenizer, or an output
    folder that holds token data already without `force`."""
    t0 = time.perf_counter()
    old = check_output(cfg.out_dir, cfg.force)
    stream = open_text(inp)
    tok = _tokenizer(spec, stream, cfg)
    staging = cfg.out_dir / f".prepare-{os.getpid()}"  # written here, moved in whole once all is good
    staging.mkdir(parents=True, exist_ok=True)
    try:
        train = _SplitWriter(staging, "train", tok.vocab_size, cfg.shard_tokens)
        val = _SplitWriter(staging, "val", tok.vocab_size, cfg.shard_tokens)
        chars = _tokenize(stream, tok, cfg, train, val)
        train.close()
        val.close()
        if train.total + val.total == 0:
            raise DataError(f"no text in {stream.source.split(': ', 1)[-1]}")
        if not val.files:
            _hold_out_tail(train, val, cfg.val_fraction)
        saved = tok.save(staging)
        sidecar = DataSidecar(vocab_size=tok.vocab_size, dtype=dtype_name(token_dtype(tok.vocab_size)),
                              tokenizer=None if saved is None else (cfg.out_dir / saved.name).resolve(),
                              eos_id=tok.eos_id, splits={"train": train.files, "val": val.files},
                              tokens={"train": train.total, "val": val.total}, source=stream.source)
        write_sidecar(staging, sidecar)
        for path in old:  # (only now: a run that fails leaves the earlier data as it was)
            path.unlink()
        for path in staging.iterdir():
            path.replace(cfg.out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    path = cfg.out_dir / SIDECAR_NAME
    return PrepareResult(sidecar, path, chars, time.perf_counter() - t0)


def _tokenize(stream: TextStream, tok: TextTokenizer, cfg: PrepareConfig, train: _SplitWriter, val: _SplitWriter) -> int:
    """Encode every piece, append the end-of-document id, and send each piece to its split; the characters read."""
    eos = None if tok.eos_id is None else np.array([tok.eos_id], dtype=np.int64)
    bar = _progress(stream, cfg.progress)
    chars = 0
    try:
        for batch in _batches(_limit(stream.pieces, cfg.max_chars)):
            encoded = tok.encode_batch([p.text for p in batch])
            out: dict[bool, list[np.ndarray]] = {False: [], True: []}
            held, seen = val.total, train.total + val.total
            for piece, ids in zip(batch, encoded):
                if piece.ends_doc and eos is not None:
                    ids = np.concatenate([ids, eos])
                n = int(ids.size)
                seen += n
                to_val = held + n <= max(cfg.val_fraction * seen, min(MIN_VAL_TOKENS, seen // 10))
                held += n if to_val else 0
                out[to_val].append(ids)
                chars += len(piece.text)
            for is_val, arrays in out.items():
                if arrays:
                    (val if is_val else train).write(np.concatenate(arrays))
            bar.update(sum(p.size for p in batch))
    finally:
        bar.close()
    return chars

