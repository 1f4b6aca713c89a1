"""Tokenizers for `p2p-diloco prepare`: raw bytes, a `tokenizer.json`, a pretrained one by name, or a
byte-level BPE trained on the data.

The last three are Hugging Face `tokenizers` (the optional extra `tokenize`), imported inside the
functions that need them, so this module loads without them; a byte-level BPE among them is
encoded by `tiktoken` when it is installed (`core.fastbpe`: the same ids, faster). Every one of them encodes a batch of
texts to arrays of ids (`encode_batch`, Rust threads for `tokenizers`), decodes ids back, and knows
its vocabulary size and its end-of-document id (None when it has none).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Iterable

import numpy as np

from p2p_diloco.core.fastbpe import FastEncoder
from p2p_diloco.errors import ConfigError, DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

BYTE_VOCAB = 256
TOKENIZER_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
"""The end-of-document token a trained tokenizer gets (GPT-2's), id 0."""
EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
"""Tokens taken as the document separator, in this order, when `--eos` names none."""
MIN_TRAIN_VOCAB = BYTE_VOCAB + 1
"""A byte-level BPE holds the 256 bytes and the end-of-document token before any merge."""
MAX_TRAIN_VOCAB = 1 << 20
INSTALL_HINT = "pip install 'p2p-diloco[tokenize]'"


@dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer to use: at most one of `source` (a tokenizer.json, a folder holding one, or a
    pretrained name) and `train_vocab` (a byte-level BPE of that size trained on the data); neither
    means raw bytes. `eos` names the document separator of a given tokenizer."""

    source: str | None = None
    train_vocab: int | None = None
    eos: str | None = None

    def __post_init__(self) -> None:
        if self.source is not None and self.train_vocab is not None:
            raise ConfigError("give --tokenizer or --train-tokenizer, not both")
        if self.train_vocab is not None and not MIN_TRAIN_VOCAB <= self.train_vocab <= MAX_TRAIN_VOCAB:
            raise ConfigError(f"--train-tokenizer {self.train_vocab}: a byte-level BPE's vocabulary must be in "
                              f"[{MIN_TRAIN_VOCAB}, {MAX_TRAIN_VOCAB}] (256 bytes and the end-of-document token, then merges)")
        if self.eos is not None and self.source is None:
            raise ConfigError("--eos names a token of the --tokenizer given")


class ByteTokenizer:
    """Raw bytes: the id of each byte of the UTF-8 text, vocabulary 256, no end-of-document token."""

    vocab_size = BYTE_VOCAB
    encoder = "bytes"
    eos_id: int | None = None
    description = "bytes"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(np.asarray(list(ids), dtype=np.uint8)).decode("utf-8", errors="replace")

    def save(self, out_dir: Path) -> Path | None:
        return None


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer`, without its post-processor's special tokens (prepare
    adds the end-of-document id itself)."""

    def __init__(self, tok: Tokenizer, description: str, eos: str | None = None, file: Path | None = None) -> None:
        self.tok, self.description, self.file = tok, description, file
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
        self.eos_id = self._eos(eos)
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster (tokenizers >= 0.20)
        self.fast = FastEncoder.of(tok)

    @property
    def encoder(self) -> str:
        """What encodes: "tiktoken" (a byte-level BPE, `core.fastbpe`) or "tokenizers"."""
        return "tiktoken" if self.fast is not None and self.fast.on else "tokenizers"

    def _eos(self, eos: str | None) -> int | None:
        if eos is not None:
            found = self.tok.token_to_id(eos)
            if found is None:
                raise DataError(f"--eos {eos!r} is not a token of {self.description}")
            return found
        for token in EOS_CANDIDATES:
            found = self.tok.token_to_id(token)
            if found is not None:
                return found
        log.warning("%s has no end-of-document token (%s): documents are joined without a separator",
                    self.description, ", ".join(EOS_CANDIDATES))
        return None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        fast = self.fast.encode_batch(texts) if self.fast is not None else None
        if fast is not None:
            return fast
        return [np.asarray(e.ids, dtype=np.int64) for e in self._encode(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, out_dir: Path) -> Path | None:
        """The tokenizer as `out_dir/tokenizer.json` (the user's file copied as it is)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / TOKENIZER_FILE
        if self.file is not None:
            if self.file.resolve() != path.resolve():
                shutil.copyfile(self.file, path)
        else:
            self.tok.save(str(path))
        return path


TextTokenizer = ByteTokenizer | HFTokenizer


def _tokenizers() -> ModuleType:
    try:
        import tokenizers
    except ImportError as e:
        raise DataError(f"a tokenizer needs the tokenizers package, which is not installed: {INSTALL_HINT}") from e
    return tokenizers


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def load_tokenizer(spec: TokenizerSpec) -> TextTokenizer | None:
    """The tokenizer `spec` names; None when it is one to train (`train_tokenizer`, once the data is known)."""
    if spec.train_vocab is not None:
        _tokenizers()
        return None
    if spec.source is None:
        return ByteTokenizer()
    tokenizers = _tokenizers()
    path = Path(spec.source).expanduser()
    if path.is_dir():
        path = path / TOKENIZER_FILE
        if not path.is_file():
            raise DataError(f"--tokenizer folder {path.parent} holds no {TOKENIZER_FILE}")
    if path.is_file():
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise DataError(f"tokenizer file {path} does not parse: {_first_line(e)}") from e
        return HFTokenizer(tok, f"tokenizer {path}", spec.eos, file=path)
    if path.suffix.lower() == ".json" or spec.source.startswith((".", "/", "~")):
        raise DataError(f"tokenizer file {path} does not exist")
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the hub client logs each retry of a failed request: the error below says it once
    try:
        tok = tokenizers.Tokenizer.from_pretrained(spec.source)
    except Exception as e:  # hub errors: no network, no such repository, no tokenizer.json in it
        raise DataError(f"cannot fetch the tokenizer {spec.source!r} from the Hugging Face Hub "
                        f"({_first_line(e)}): pass a tokenizer.json file instead") from e
    finally:
        logging.disable(disabled)
    return HFTokenizer(tok, f"tokenizer {spec.source}", spec.eos)


def train_tokenizer(texts: Iterable[str], vocab_size: int, progress: bool = False) -> HFTokenizer:
    """A byte-level BPE (GPT-2's scheme: every byte is a token, so any text encodes, and decodes back
    exactly) of `vocab_size` tokens trained on `texts`; its end-of-document token `<|endoftext|>` is id 0.
    `progress`: the trainer's own progress bars on stderr."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    got = tok.get_vocab_size(with_added_tokens=True)
    if got < vocab_size:
        log.warning("the data holds only enough pairs for a vocabulary of %d, not %d", got, vocab_size)
    return HFTokenizer(tok, f"byte-level BPE of {got} trained on the data")
