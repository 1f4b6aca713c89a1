"""`p2p-diloco bench prepare`: how fast this CPU turns text into token shards.

The text is this Python's standard-library sources (as the default corpus, `core.data`), repeated
until there are `chars` characters, written as a folder of text files. A byte-level BPE of `vocab`
tokens is trained on its first `train_chars` characters (`core.tokenizer.train_tokenizer`), then
timed twice over the whole text: `encode_mb_s`, the tokenizer's `encode_batch` alone on batches of
`core.prepare.BATCH_CHARS` characters (the ids as numpy arrays included), by `encoder` (tiktoken when
it is installed, `core.fastbpe`); `prepare_mb_s`, the whole of `prepare` from the files to the shards
and sidecar (reading, encoding, splitting, writing). `tokenizers_encode_mb_s` is `tokenizers` alone
on the first `COMPARE_CHARS` characters, for comparison. MB/s
are of UTF-8 text bytes (the sources are nearly all ASCII: a byte is a character). `load_avg` is the
machine's one-minute load average at the end: the figures are this CPU's only when nothing else ran;
`encode_mb_per_cpu_s` (MB per second of this process's CPU time, all its threads) is much less
slowed by other processes, and times the cores is what the CPU would encode alone.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

FILES = 16
COMPARE_CHARS = 8_000_000


def stdlib_text(chars: int) -> list[str]:
    """`chars` characters of standard-library sources, one string per source file, repeated as needed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    docs: list[str] = []
    total = 0
    while total < chars:
        for p in paths:
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            text = text[: chars - total]
            docs.append(text)
            total += len(text)
            if total >= chars:
                break
    return docs


def run(chars: int, vocab: int, train_chars: int, log: Callable[[str], None] = lambda _msg: None) -> dict:
    from p2p_diloco.core.prepare import BATCH_CHARS, PrepareConfig, prepare
    from p2p_diloco.core.textsource import TextInput
    from p2p_diloco.core.tokenizer import TokenizerSpec, train_tokenizer

    docs = stdlib_text(chars)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    log(f"{len(docs)} documents, {nbytes / 1e6:.1f} MB; training a byte-level BPE of {vocab} on {train_chars / 1e6:.1f} M characters")
    t0 = time.perf_counter()
    sample, seen = [], 0
    for d in docs:
        if seen >= train_chars:
            break
        sample.append(d[: train_chars - seen])
        seen += len(sample[-1])
    tok = train_tokenizer(sample, vocab)
    train_s = time.perf_counter() - t0

    log("encoding")
    t0, c0 = time.perf_counter(), time.process_time()
    tokens, batch, size = 0, [], 0
    for d in docs:
        batch.append(d)
        size += len(d)
        if size >= BATCH_CHARS:
            tokens += sum(a.size for a in tok.encode_batch(batch))
            batch, size = [], 0
    tokens += sum(a.size for a in tok.encode_batch(batch)) if batch else 0
    encode_s, encode_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    encoder = tok.encoder
    tokenizers_mb_s = nbytes / 1e6 / encode_s
    if tok.fast is not None:  # tokenizers alone, on a part of the text, for comparison
        part = stdlib_text(min(chars, COMPARE_CHARS))
        tok.fast.on = False
        t0 = time.perf_counter()
        tok.encode_batch(part)
        tokenizers_mb_s = sum(len(d.encode("utf-8")) for d in part) / 1e6 / (time.perf_counter() - t0)
        tok.fast.on = encoder == "tiktoken"

    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        text_dir = work / "text"
        text_dir.mkdir()
        per = -(-len(docs) // FILES)
        for i in range(FILES):
            (text_dir / f"part_{i:02d}.txt").write_text("".join(docs[i * per:(i + 1) * per]), encoding="utf-8")
        tok.save(work)
        log("prepare")
        t0 = time.perf_counter()
        result = prepare(TextInput(path=text_dir), TokenizerSpec(source=str(work / "tokenizer.json")),
                         PrepareConfig(out_dir=work / "out", progress=False))
        prepare_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"chars": sum(map(len, docs)), "bytes": nbytes, "tokens": tokens, "vocab": tok.vocab_size,
            "bytes_per_token": round(nbytes / max(tokens, 1), 3), "train_chars": seen, "train_s": round(train_s, 2),
            "encode_s": round(encode_s, 2), "encode_mb_s": round(nbytes / 1e6 / encode_s, 2),
            "encode_mb_per_cpu_s": round(nbytes / 1e6 / encode_cpu_s, 2), "encoder": encoder,
            "tokenizers_encode_mb_s": round(tokenizers_mb_s, 2),
            "prepare_s": round(prepare_s, 2), "prepare_mb_s": round(nbytes / 1e6 / prepare_s, 2),
            "prepare_tokens": sum(result.sidecar.tokens.values()),
            "threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "load_avg": round(os.getloadavg()[0], 2)}
