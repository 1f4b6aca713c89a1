"""The text `p2p-diloco prepare` tokenizes: a text file, a folder of them, or a Hugging Face dataset.

Text comes as `Piece`s: a whole document, or (a large file) a part of one of about 64 KiB cut at
a line end, so no file is ever read whole. A file is one document; a dataset's row is one. Files
are UTF-8 (a byte that is not becomes U+FFFD); a folder's are its text files (`TEXT_SUFFIXES`) in
sorted order of their relative path, hidden ones skipped.

A dataset is read with the `datasets` package (the optional extra `datasets`), imported only then:
a saved dataset folder (`save_to_disk`), a data file (.jsonl, .json, .parquet, .csv, .arrow, .txt),
a folder of data files, or a dataset on the Hugging Face Hub by name (streamed, where the network
allows).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import BinaryIO, Iterable, Iterator

from p2p_diloco.errors import DataError

TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".text", ""}
"""The files of a folder that are text (as `--data FOLDER` reads them)."""
CHUNK_BYTES = 64 << 10
DATA_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow", ".txt": "text"}
"""A data file's suffix -> the `datasets` builder that reads it."""
DATASETS_HINT = "pip install 'p2p-diloco[datasets]'"


@dataclass(frozen=True)
class Piece:
    """Some text; `size` is how far it moves the progress (bytes read, or one row), `ends_doc` whether
    a document ends with it."""

    text: str
    size: int
    ends_doc: bool


@dataclass(frozen=True)
class TextInput:
    """Where the text is: `path` (a text file or folder), or `dataset` (a name on the Hub, or a local
    saved dataset, data file or folder of them) with its `config`, `split` and the `text_field` of its rows."""

    path: Path | None = None
    dataset: str | None = None
    config: str | None = None
    split: str = "train"
    text_field: str = "text"

    def __post_init__(self) -> None:
        if (self.path is None) == (self.dataset is None):
            raise DataError("give a text file or folder, or --dataset, and only one of them")


@dataclass(frozen=True)
class TextStream:
    """An opened input: its pieces, how much there is (`total` in `unit`s, None when unknown)."""

    source: str
    total: int | None
    unit: str
    pieces: Iterable[Piece]


def open_text(inp: TextInput) -> TextStream:
    """Check the input and open it; `DataError` (one line) for a missing path, an empty folder, a missing package."""
    if inp.path is not None:
        files = text_files(inp.path)
        return TextStream(f"text: {inp.path.resolve()}", sum(f.stat().st_size for f in files), "B", _FilePieces(files))
    assert inp.dataset is not None
    return _open_dataset(inp)


def text_files(path: Path) -> list[Path]:
    """The text files at `path`: itself, or those under the folder (sorted, hidden ones skipped)."""
    if not path.exists():
        raise DataError(f"{path} does not exist")
    if path.is_file():
        return [path]
    files = sorted((p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                   key=lambda p: p.relative_to(path).as_posix())
    if not files:
        raise DataError(f"folder {path} holds no text files ({', '.join(sorted(s or '(no suffix)' for s in TEXT_SUFFIXES))})")
    return files


def _open_bytes(path: Path) -> BinaryIO:
    return open(path, "rb")


class _FilePieces:
    """The files' text, each a document, in pieces of about `CHUNK_BYTES` cut after a line end (`_line_cut`)."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __iter__(self) -> Iterator[Piece]:
        for path in self.files:
            yield from self._file(path)

    @staticmethod
    def _file(path: Path) -> Iterator[Piece]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        carry, carry_size = "", 0
        pending: Piece | None = None  # held back until it is known whether the file ends with it
        try:
            with _open_bytes(path) as f:
                while chunk := f.read(CHUNK_BYTES):
                    text = carry + decoder.decode(chunk)
                    cut = _line_cut(text)
                    carry, carry_size = text[cut:], carry_size + len(chunk)
                    if cut:
                        if pending is not None:
                            yield pending
                        pending, carry_size = Piece(text[:cut], carry_size, False), 0
                tail = carry + decoder.decode(b"", final=True)
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}") from e
        if pending is None:
            yield Piece(tail, carry_size, True)
        else:
            yield Piece(pending.text + tail, pending.size + carry_size, True)


def _line_cut(text: str) -> int:
    """Where to cut `text`: after its last line end that a non-blank character follows, so a run of
    whitespace is never split (byte-level BPE pre-tokenizers, GPT-2's, split text exactly there too);
    else after its last line end; else nowhere (all of it)."""
    end = len(text) - 1
    while (i := text.rfind("\n", 0, end)) >= 0 and len(text) - i <= CHUNK_BYTES:
        if not text[i + 1].isspace():
            return i + 1
        end = i
    i = text.rfind("\n") + 1
    return i if i and len(text) - i <= CHUNK_BYTES else len(text)


def _datasets() -> ModuleType:
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"reading a Hugging Face dataset needs the datasets package, which is not installed: "
                        f"{DATASETS_HINT}") from e
    return datasets


def _open_dataset(inp: TextInput) -> TextStream:
    datasets = _datasets()
    name, local = str(inp.dataset), Path(str(inp.dataset)).expanduser()
    try:
        if local.is_dir() and ((local / "state.json").is_file() or (local / "dataset_dict.json").is_file()):
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if inp.split not in ds:
                    raise DataError(f"dataset {local} has no split {inp.split!r}; it has {', '.join(ds)}")
                ds = ds[inp.split]
        elif local.is_file():
            builder = DATA_FILES.get(local.suffix.lower())
            if builder is None:
                raise DataError(f"{local}: not a data file datasets reads ({', '.join(sorted(DATA_FILES))})")
            ds = datasets.load_dataset(builder, data_files=str(local), split="train")
        elif local.is_dir():
            ds = datasets.load_dataset(str(local), inp.config, split=inp.split)
        else:
            ds = datasets.load_dataset(name, inp.config, split=inp.split, streaming=True)
    except DataError:
        raise
    except Exception as e:  # datasets raises many kinds (hub, network, file format): each is the user's input
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"cannot load the dataset {name!r}: {first}") from e
    columns = ds.column_names
    if columns is not None and inp.text_field not in columns:
        raise DataError(f"dataset {name!r} has no column {inp.text_field!r} (--text-field); it has {', '.join(columns)}")
    total = len(ds) if isinstance(ds, datasets.Dataset) else None
    source = f"dataset: {name}" + (f" ({inp.config})" if inp.config else "") + f", split {inp.split}, field {inp.text_field}"
    return TextStream(source, total, "doc", _RowPieces(ds, inp.text_field, name))


class _RowPieces:
    """A dataset's rows, each a document."""

    def __init__(self, ds: Iterable[dict[str, object]], field: str, name: str) -> None:
        self.ds, self.field, self.name = ds, field, name

    def __iter__(self) -> Iterator[Piece]:
        for row in self.ds:
            text = row.get(self.field)
            if not isinstance(text, str):
                raise DataError(f"dataset {self.name!r}: a row's {self.field!r} is {type(text).__name__}, not text")
            yield Piece(text, 1, True)
