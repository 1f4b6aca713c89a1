"""`p2p-diloco prepare`: text into token shards and their sidecar, read back by `join --data`'s loader.

Small text generated in tmp_path; the tokenizers are trained or built here (no network).
"""

from __future__ import annotations

import json
import random
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.core.data import load_corpus
from p2p_diloco.core.shards import HEADER_BYTES, open_shard, write_shard
from p2p_diloco.core.sidecar import SIDECAR_NAME, DataSidecar, read_sidecar, write_sidecar
from p2p_diloco.errors import DataError

tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.timeout(120)


def words_text(seed: int, n_lines: int = 80) -> str:
    """Lines of made-up words (some non-ASCII), varied enough for a BPE of 512 to find its merges."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzéü"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(300)]
    return "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 14))) for _ in range(n_lines)) + "\n"


def prepare(*args: str):
    return CliRunner().invoke(main, ["prepare", *args, "-q"])


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def split_ids(folder, sidecar: DataSidecar, split: str) -> np.ndarray:
    return np.concatenate([np.asarray(open_shard(folder / name)[0]) for name in sidecar.splits[split]]).astype(np.int64)


def test_a_trained_bpe_round_trips_the_text_and_join_reads_its_vocabulary(tmp_path):
    src = tmp_path / "text"
    src.mkdir()
    docs = [words_text(i) for i in range(3)]
    for i, doc in enumerate(docs):
        (src / f"doc{i}.txt").write_text(doc, encoding="utf-8")
    (src / ".hidden.txt").write_text("skipped")
    out = tmp_path / "out"
    r = prepare(str(src), "-o", str(out), "--train-tokenizer", "512")
    assert r.exit_code == 0, r.output
    s = read_sidecar(out)
    assert s is not None and s.vocab_size == 512 and s.dtype == "uint16" and s.eos_id == 0
    assert s.tokenizer == (out / "tokenizer.json").resolve() and s.tokenizer.is_file()
    assert s.splits == {"train": ["train_000.bin"], "val": ["val_000.bin"]} and str(src.resolve()) in s.source
    train, val = split_ids(out, s, "train"), split_ids(out, s, "val")
    assert (len(train), len(val)) == (s.tokens["train"], s.tokens["val"]) and len(val) >= len(train) // 20
    ids = np.concatenate([train, val])
    assert ids.max() < 512 and (ids == 0).sum() == 3  # one end-of-document id after each file
    tok = tokenizers.Tokenizer.from_file(str(s.tokenizer))
    ends = np.flatnonzero(ids == 0)
    pieces = np.split(ids, ends + 1)[:-1]
    assert [tok.decode(p[:-1].tolist()) for p in pieces] == docs  # sorted by name, hidden file skipped

    corpus = load_corpus(out)  # what join --data OUT does: no --vocab-size needed
    assert corpus.vocab_size == 512 and corpus.train.numel() == len(train) and corpus.val.numel() == len(val)
    assert corpus.val.names == [str(out / "val_000.bin")]
    assert load_corpus(out, vocab_size=512).vocab_size == 512
    with pytest.raises(DataError, match="--vocab-size 600 disagrees with the vocabulary 512"):
        load_corpus(out, vocab_size=600)
    bad = CliRunner().invoke(main, ["simulate", "--data", str(out), "--vocab-size", "600"])
    one_line_error(bad, "--vocab-size 600 disagrees with the vocabulary 512", "leave --vocab-size out")


def test_a_100k_vocabulary_is_written_as_uint32_and_its_high_ids_survive(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(100_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    rng = random.Random(0)
    text = " ".join(f"w{rng.randrange(100_000)}" for _ in range(3000)) + " w99999 w65534 w65535"
    (tmp_path / "big.txt").write_text(text)
    out = tmp_path / "out"
    r = prepare(str(tmp_path / "big.txt"), "-o", str(out), "--tokenizer", str(tmp_path / "tokenizer.json"))
    assert r.exit_code == 0, r.output
    s = read_sidecar(out)
    assert s is not None and s.vocab_size == 100_002 and s.dtype == "uint32" and s.eos_id == 1
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()  # copied as it is
    header = np.fromfile(out / "train_000.bin", dtype="<i4", count=4)
    assert header.tolist() == [20240801, 7, s.tokens["train"], 100_002]  # llm.c's uint32 (Llama 3) header
    ids = np.concatenate([split_ids(out, s, "train"), split_ids(out, s, "val")])
    assert ids.tolist() == tok.encode(text).ids + [1] and ids.max() == 100_001 and (ids > 65535).sum() > 1000
    corpus = load_corpus(out)
    assert corpus.vocab_size == 100_002
    assert corpus.val.window(0, corpus.val.numel() - 4, 4).tolist() == [100_001, 65_536, 65_537, 1]


def test_raw_bytes_without_a_tokenizer(tmp_path):
    text = words_text(7, 400)
    (tmp_path / "a.txt").write_text(text)
    r = prepare(str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"), "--val-fraction", "0.1", "--json")
    assert r.exit_code == 0, r.output
    s = read_sidecar(tmp_path / "out")
    assert s is not None and (s.vocab_size, s.dtype, s.tokenizer, s.eos_id) == (256, "uint16", None, None)
    assert json.loads(r.stdout)["tokens"] == s.tokens
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    ids = np.concatenate([split_ids(tmp_path / "out", s, "train"), split_ids(tmp_path / "out", s, "val")])
    assert bytes(ids.astype(np.uint8)).decode() == text
    assert abs(s.tokens["val"] - 0.1 * len(ids)) <= 1
    assert load_corpus(tmp_path / "out").vocab_size == 256


def test_large_files_are_read_in_pieces_and_shards_roll_over(tmp_path, monkeypatch):
    from p2p_diloco.core import textsource

    monkeypatch.setattr(textsource, "CHUNK_BYTES", 64)
    text = words_text(3, 200)
    (tmp_path / "a.txt").write_text(text)
    r = prepare(str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"), "--shard-tokens", "1000", "--val-fraction", "0.1")
    assert r.exit_code == 0, r.output
    s = read_sidecar(tmp_path / "out")
    assert s is not None and len(s.splits["train"]) > 3 and s.splits["val"]
    assert all(open_shard(tmp_path / "out" / f)[0].size <= 1000 for f in s.splits["train"] + s.splits["val"])
    train, val = split_ids(tmp_path / "out", s, "train"), split_ids(tmp_path / "out", s, "val")
    assert abs(len(val) - 0.1 * (len(train) + len(val))) < 200  # pieces of about 64 bytes, held out as it goes
    assert sorted(bytes(ids.astype(np.uint8)).decode() for ids in (train, val))  # whole lines: valid UTF-8
    c = load_corpus(tmp_path / "out")
    assert [n.rsplit("/", 1)[-1] for n in c.train.names] == s.splits["train"]


def test_nanogpt_and_llmc_uint16_shards_still_load(tmp_path):
    nano = tmp_path / "nano"
    nano.mkdir()
    np.arange(3000, dtype="<u2").tofile(nano / "train.bin")
    (np.arange(500, dtype="<u2") + 7).tofile(nano / "val.bin")
    c = load_corpus(nano, vocab_size=50257)
    assert (c.vocab_size, c.train.numel(), c.val.numel()) == (50257, 3000, 500)
    assert c.val.window(0, 0, 3).tolist() == [7, 8, 9]
    llmc = tmp_path / "llmc"
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, 2000  # llm.c's own: header[3] zero
    llmc.mkdir()
    with open(llmc / "fineweb_train_000001.bin", "wb") as f:
        f.write(header.tobytes() + (np.arange(2000) % 1000).astype("<u2").tobytes())
    c = load_corpus(llmc, vocab_size=1000)
    assert c.train.window(0, 0, 3).tolist() == [0, 1, 2] and c.train.numel() + c.val.numel() == 2000
    write_shard(tmp_path / "ours.bin", np.arange(100), 100)
    assert (tmp_path / "ours.bin").stat().st_size == HEADER_BYTES + 200 and open_shard(tmp_path / "ours.bin")[1] == 100


def test_the_sidecar_round_trips_and_a_malformed_one_is_one_clear_error(tmp_path):
    assert read_sidecar(tmp_path) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    s = DataSidecar(vocab_size=70_000, dtype="uint32", tokenizer=(tmp_path / "tokenizer.json").resolve(), eos_id=3,
                    splits={"train": ["train_000.bin"], "val": ["val_000.bin"]}, tokens={"train": 10, "val": 2},
                    source="text: x")
    path = write_sidecar(tmp_path, s)
    assert path.name == SIDECAR_NAME and json.loads(path.read_text())["tokenizer"] == "tokenizer.json"
    assert read_sidecar(tmp_path) == s and read_sidecar(tmp_path / "train_000.bin") == s
    with pytest.raises(DataError, match="lists train_000.bin, which is not in"):
        load_corpus(write_shard(tmp_path / "other.bin", np.array([1, 2]), 70_000).parent)
    path.write_text('{"vocab_size": 10, "dtype": "int8", "splits": {}}')
    with pytest.raises(DataError, match=r"dataset\.json is malformed: dtype 'int8' is not one of uint16, uint32"):
        read_sidecar(tmp_path)
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"cannot read .*dataset\.json: Expecting property name"):
        read_sidecar(tmp_path)


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text(words_text(1))
    a = str(tmp_path / "a.txt")
    out = tmp_path / "out"
    one_line_error(prepare(str(tmp_path / "missing"), "-o", str(out)), "missing does not exist")
    (tmp_path / "empty").mkdir()
    one_line_error(prepare(str(tmp_path / "empty"), "-o", str(out)), "holds no text files")
    one_line_error(prepare("-o", str(out)), "give a text file or folder, or --dataset")
    (tmp_path / "bad.json").write_text('{"model": 1}')
    one_line_error(prepare(a, "-o", str(out), "--tokenizer", str(tmp_path / "bad.json")), "bad.json does not parse")
    one_line_error(prepare(a, "-o", str(out), "--tokenizer", str(tmp_path / "nope.json")), "nope.json does not exist")
    one_line_error(prepare(a, "-o", str(out), "--train-tokenizer", "100"), "must be in [257, 1048576]")
    one_line_error(prepare(a, "-o", str(out), "--train-tokenizer", "9999999"), "must be in [257, 1048576]")
    one_line_error(prepare(a, "-o", str(out), "--val-fraction", "0.7"), "--val-fraction must be in (0, 0.5)")
    from p2p_diloco.core import tokenizer

    class Offline:
        @staticmethod
        def from_pretrained(name):
            raise RuntimeError("An error happened while trying to locate the file on the Hub\nmore")

    with monkeypatch.context() as m:
        m.setattr(tokenizer, "_tokenizers", lambda: types.SimpleNamespace(Tokenizer=Offline))
        one_line_error(prepare(a, "-o", str(out), "--tokenizer", "gpt2"), "cannot fetch the tokenizer 'gpt2'",
                       "locate the file on the Hub)", "pass a tokenizer.json file instead")
    monkeypatch.setitem(sys.modules, "datasets", None)  # the optional extra, not installed
    one_line_error(prepare("--dataset", "roneneldan/TinyStories", "-o", str(out)),
                   "needs the datasets package", "pip install 'p2p-diloco[datasets]'")

    from p2p_diloco.core import textsource

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as m:
        m.setattr(textsource, "_open_bytes", refuse)
        one_line_error(prepare(a, "-o", str(out)), "cannot read", "Permission denied")
    assert not out.exists() or not any(out.iterdir())  # a failed run leaves nothing behind


def test_an_output_that_holds_shards_is_refused_unless_force(tmp_path):
    (tmp_path / "a.txt").write_text(words_text(1))
    out = tmp_path / "out"
    assert prepare(str(tmp_path / "a.txt"), "-o", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "b.txt").write_text(words_text(2))
    one_line_error(prepare(str(tmp_path / "b.txt"), "-o", str(out), "--train-tokenizer", "300"), "already holds token data",
                   "--force")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing overwritten
    (tmp_path / "empty.txt").write_text("")  # --force, and the run fails after the tokenizer: the earlier data stays
    assert prepare(str(tmp_path / "empty.txt"), "-o", str(out), "--force").exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "stale_999.bin").write_bytes(b"\0\0")
    r = prepare(str(tmp_path / "b.txt"), "-o", str(out), "--train-tokenizer", "300", "--force")
    assert r.exit_code == 0, r.output
    s = read_sidecar(out)
    assert s is not None and s.tokenizer is not None and not (out / "stale_999.bin").exists()
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "tokenizer.json", "train_000.bin", "val_000.bin"]


def test_bench_prepare_reports_its_rates():
    from p2p_diloco.bench.prepare import run

    out = run(300_000, 1000, 100_000)
    assert out["prepare_tokens"] > out["tokens"] > 0  # prepare adds an end-of-document id after each file
    assert out["encode_mb_s"] > 0 and out["prepare_mb_s"] > 0 and out["vocab"] == 1000 and out["bytes"] >= 300_000


def test_a_local_dataset_file_and_a_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")  # the optional extra `datasets`

    rows = [{"text": words_text(i, 3), "id": i} for i in range(200)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = prepare("--dataset", str(tmp_path / "rows.jsonl"), "-o", str(tmp_path / "a"), "--train-tokenizer", "400")
    assert r.exit_code == 0, r.output
    s = read_sidecar(tmp_path / "a")
    assert s is not None and s.eos_id == 0 and s.tokens["val"] >= (s.tokens["train"] + s.tokens["val"]) // 20
    ids = np.concatenate([split_ids(tmp_path / "a", s, "train"), split_ids(tmp_path / "a", s, "val")])
    assert (ids == 0).sum() == 200  # one end-of-document id per row
    datasets.load_dataset("json", data_files=str(tmp_path / "rows.jsonl"), split="train").save_to_disk(str(tmp_path / "saved"))
    r = prepare("--dataset", str(tmp_path / "saved"), "-o", str(tmp_path / "b"))
    assert r.exit_code == 0, r.output
    b = read_sidecar(tmp_path / "b")
    assert b is not None and b.vocab_size == 256 and sum(b.tokens.values()) == sum(len(r["text"].encode()) for r in rows)
    one_line_error(prepare("--dataset", str(tmp_path / "rows.jsonl"), "--text-field", "body", "-o", str(tmp_path / "c")),
                   "has no column 'body' (--text-field); it has text, id")


def test_tiktoken_encodes_a_byte_level_bpe_as_tokenizers_does():
    pytest.importorskip("tiktoken")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from p2p_diloco.core.fastbpe import FastEncoder
    from p2p_diloco.core.tokenizer import train_tokenizer

    texts = [words_text(i, 40) + "  x = f(1, 2)\n\tif y:  # ünïcode 東京 🙂\n" for i in range(12)]
    tok = train_tokenizer(texts[:6], 600)
    assert tok.encoder == "tiktoken"
    fast = tok.encode_batch(texts)
    slow = [e.ids for e in tok.tok.encode_batch(texts, add_special_tokens=False)]
    assert [a.tolist() for a in fast] == slow and tok.encoder == "tiktoken"
    # text holding an added token is for tokenizers: it turns it into its id
    assert tok.encode_batch(["a <|endoftext|> b"])[0].tolist() == tok.tok.encode("a <|endoftext|> b").ids
    assert 0 in tok.encode_batch(["a <|endoftext|> b"])[0].tolist()
    # anything but a plain byte-level BPE is left to tokenizers
    other = Tokenizer.from_str(tok.tok.to_str())
    other.normalizer = normalizers.NFKC()
    assert FastEncoder.of(other) is None
    other = Tokenizer.from_str(tok.tok.to_str())
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    assert FastEncoder.of(other) is None
    assert FastEncoder.of(Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))) is None
