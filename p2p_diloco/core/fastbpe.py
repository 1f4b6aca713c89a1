"""A faster encoder for byte-level BPE tokenizers (GPT-2's scheme, and the one `prepare` trains).

`tokenizers` encodes about 1.5 MB of text per CPU-second on the machines this project is built on;
`tiktoken`, when it is installed (the extra `tokenize`), encodes the same BPE three times faster per
core. It takes the tokenizer as byte strings ranked by id, which is the same BPE when:

- the tokenizer has no normalizer, and its pre-tokenizer is `ByteLevel` with GPT-2's regex, no
  prefix space (the regex below is that one);
- its model is a plain `BPE` (no dropout, no subword prefix or suffix, no byte fallback, merges
  not ignored), every token of it is a byte-level string, and each merge makes a token whose id is
  larger than those of the merges before it (the order `tokenizers`' trainer and GPT-2 use), so
  merging by the id of the result (tiktoken) is merging by the merge's rank (`tokenizers`);
- the text holds none of the tokenizer's added tokens (`tokenizers` would turn `<|endoftext|>` in
  the text into its id; `encode_ordinary` does not): a batch that does is encoded by `tokenizers`.

`FastEncoder` checks what it encodes against `tokenizers`: the first mebibyte of text, then the
first text of each batch; at the first difference it gives up and `tokenizers` encodes the rest.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

FIRST_CHECK_CHARS = 1 << 20
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_level_chars() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (`bytes_to_unicode`), as char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict.fromkeys(keep), 0
    out = {chr(b): b for b in keep}
    for b in range(256):
        if b not in chars:
            out[chr(256 + extra)] = b
            extra += 1
    return out


def _ranks(tok: Tokenizer) -> dict[bytes, int] | None:
    """The tokenizer's tokens as bytes -> id, when the conditions of the module docstring hold; else None."""
    spec = json.loads(tok.to_str())
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    if spec.get("normalizer") is not None or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space") or model.get("type") != "BPE" or model.get("dropout") \
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or model.get("byte_fallback") or model.get("ignore_merges"):
        return None
    chars = byte_level_chars()
    vocab: dict[str, int] = model.get("vocab") or {}
    try:
        ranks = {bytes(chars[c] for c in token): i for token, i in vocab.items()}
    except KeyError:
        return None
    if len(ranks) != len(vocab) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    last = -1
    for merge in model.get("merges") or []:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        made = vocab.get(a + b)
        if made is None or made <= last:
            return None
        last = made
    return ranks


class FastEncoder:
    """`tiktoken` over a byte-level BPE `tokenizers.Tokenizer` (see the module docstring)."""

    def __init__(self, tok: Tokenizer, enc: object, added: list[str]) -> None:
        self.tok, self.enc, self.added = tok, enc, added
        self.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.checked = False
        self.on = True

    @classmethod
    def of(cls, tok: Tokenizer) -> FastEncoder | None:
        """A fast encoder for `tok`, or None when tiktoken is not installed or `tok` is not a plain byte-level BPE."""
        try:
            import tiktoken
        except ImportError:
            return None
        ranks = _ranks(tok)
        if ranks is None:
            return None
        try:
            enc = tiktoken.Encoding("p2p-diloco-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
        except Exception as e:  # a vocabulary tiktoken refuses: tokenizers encodes it
            log.info("tiktoken cannot take this tokenizer (%s): tokenizers encodes it", e)
            return None
        added = [t.content for t in tok.get_added_tokens_decoder().values()]
        return cls(tok, enc, added)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray] | None:
        """The ids of each text, or None when this batch (or any from now on) is for `tokenizers` to encode."""
        if not self.on or any(a in t for t in texts for a in self.added):
            return None
        ids = self.enc.encode_ordinary_batch(texts, num_threads=self.threads)
        sample = texts[:1]
        if not self.checked:  # the first batch's first mebibyte or so
            chars = np.cumsum([len(t) for t in texts])
            sample = texts[: max(1, int(np.searchsorted(chars, FIRST_CHECK_CHARS, side="right")))]
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        if [e.ids for e in encode(sample, add_special_tokens=False)] != ids[: len(sample)]:
            log.warning("tiktoken and tokenizers encode this text differently: tokenizers encodes the rest")
            self.on = False
            return None
        self.checked = True
        return [np.asarray(i, dtype=np.int64) for i in ids]
