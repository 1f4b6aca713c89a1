"""The sidecar `dataset.json` that `p2p-diloco prepare` writes beside its token shards.

It names what the shards alone cannot: the tokenizer (its `tokenizer.json`, copied beside the
shards; none for raw bytes), the vocabulary, the token width, the end-of-document id, which files
are the train and which the validation split, and where the text came from. Plain Python and json:
no torch, no tokenizers.

    {"format": 1, "vocab_size": 512, "dtype": "uint16", "tokenizer": "tokenizer.json", "eos_id": 0,
     "splits": {"train": ["train_000.bin"], "val": ["val_000.bin"]},
     "tokens": {"train": 90000, "val": 4700}, "source": "text: /data/books"}

The tokenizer and the shard names are stored relative to the folder; `read_sidecar` makes the
tokenizer path absolute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from p2p_diloco.errors import DataError

SIDECAR_NAME = "dataset.json"
SIDECAR_FORMAT = 1
DTYPES = ("uint16", "uint32")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class DataSidecar:
    """What a prepared data folder holds (see the module docstring for the file)."""

    vocab_size: int
    dtype: str
    """"uint16" or "uint32": the width of the token ids in the shards."""
    tokenizer: Path | None
    """The absolute path of the tokenizer.json beside the shards; None for raw bytes."""
    eos_id: int | None
    splits: dict[str, list[str]]
    """"train" / "val" -> shard file names, relative to the folder."""
    tokens: dict[str, int]
    """"train" / "val" -> number of tokens in that split."""
    source: str


def _folder(data_path: Path) -> Path:
    return data_path if data_path.is_dir() else data_path.parent


def read_sidecar(data_path: Path) -> DataSidecar | None:
    """The sidecar of a data folder (or of the folder holding a shard file), None when there is none.

    Raises `DataError`, in one line, when the file is there but unreadable or malformed.
    """
    folder = _folder(Path(data_path))
    path = folder / SIDECAR_NAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {path}: {str(e).splitlines()[0]}") from e
    try:
        return _parse(raw, folder)
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path} is malformed: {e}") from e


def _int(raw: dict[str, object], key: str, optional: bool = False) -> int | None:
    value = raw.get(key) if optional else raw[key]
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, not {value!r}")
    return value


def _parse(raw: object, folder: Path) -> DataSidecar:
    if not isinstance(raw, dict):
        raise TypeError("expected a JSON object")
    if raw.get("format", SIDECAR_FORMAT) != SIDECAR_FORMAT:
        raise ValueError(f"format {raw.get('format')!r} is not {SIDECAR_FORMAT}")
    vocab = _int(raw, "vocab_size")
    assert vocab is not None
    if vocab < 1:
        raise ValueError("vocab_size must be at least 1")
    dtype = raw["dtype"]
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tok = raw.get("tokenizer")
    if tok is not None and not isinstance(tok, str):
        raise TypeError(f"tokenizer must be a file name or null, not {tok!r}")
    splits_raw, tokens_raw = raw["splits"], raw.get("tokens", {})
    if not isinstance(splits_raw, dict) or not isinstance(tokens_raw, dict):
        raise TypeError("splits and tokens must be objects")
    splits: dict[str, list[str]] = {}
    for name, files in splits_raw.items():
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise TypeError(f"splits.{name} must be a list of file names")
        splits[str(name)] = list(files)
    tokens = {str(k): _int(tokens_raw, k) or 0 for k in tokens_raw}
    source = raw.get("source", "")
    if not isinstance(source, str):
        raise TypeError("source must be a string")
    return DataSidecar(vocab_size=vocab, dtype=dtype, tokenizer=(folder / tok).resolve() if tok else None,
                       eos_id=_int(raw, "eos_id", optional=True), splits=splits, tokens=tokens, source=source)


def write_sidecar(out_dir: Path, sidecar: DataSidecar) -> Path:
    """Write `sidecar` as `out_dir/dataset.json` (the tokenizer stored relative to `out_dir`); its path."""
    out_dir = Path(out_dir)
    tok: str | None = None
    if sidecar.tokenizer is not None:
        t = Path(sidecar.tokenizer)
        try:
            tok = t.resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            tok = str(t.resolve())
    doc = {"format": SIDECAR_FORMAT, "vocab_size": sidecar.vocab_size, "dtype": sidecar.dtype, "tokenizer": tok,
           "eos_id": sidecar.eos_id, "splits": sidecar.splits, "tokens": sidecar.tokens, "source": sidecar.source}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SIDECAR_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
