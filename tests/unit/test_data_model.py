import math

import pytest
import torch

from p2p_diloco.config import ModelConfig
from p2p_diloco.core.data import BatchSampler, eval_batches, load_corpus
from p2p_diloco.core.model import build_model
from p2p_diloco.errors import ConfigError, DataError


def test_default_corpus_is_deterministic_with_a_held_out_split():
    a, b = load_corpus(max_bytes=3_000_000), load_corpus(max_bytes=3_000_000)
    assert a.source == "python-stdlib"
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert a.val.numel() > 0 and a.train.numel() > 10 * a.val.numel() // 2


def test_user_file_and_folder(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("hello world\n" * 200)
    c = load_corpus(f)
    assert c.train.numel() + c.val.numel() == 2400 and c.val.numel() == 120
    (tmp_path / "sub").mkdir()
    for i in range(40):
        (tmp_path / "sub" / f"f{i}.txt").write_text(f"file {i}\n" * 50)
    c = load_corpus(tmp_path / "sub")
    assert c.val.numel() > 0 and c.train.numel() > 0


def test_bad_paths_and_empty_corpora_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(tmp_path / "missing")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty or too small"):
        load_corpus(tmp_path / "empty.txt")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.so").write_bytes(b"\0" * 10)
    with pytest.raises(DataError, match="no text files"):
        load_corpus(tmp_path / "bin")


def test_sampler_is_seeded():
    data = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    x1, y1 = BatchSampler(data, 16, 4, seed=3).next()
    x2, y2 = BatchSampler(data, 16, 4, seed=3).next()
    assert torch.equal(x1, x2) and x1.shape == (4, 16)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one


def test_presets_and_overrides():
    assert 0.7e6 < build_model(ModelConfig(size="tiny")).num_params() < 1.3e6
    assert 10e6 <= build_model(ModelConfig(size="small")).num_params() <= 20e6
    m = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16))
    logits, loss = m(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))
    assert logits.shape == (2, 16, 256) and loss.item() > 0
    with pytest.raises(ConfigError, match="model.n_embd must be divisible by n_head"):
        ModelConfig(n_embd=30, n_head=4)
    with pytest.raises(ConfigError, match="model.size"):
        ModelConfig(size="huge")


# -- token shards (nanoGPT / llm.c) ----------------------------------------------------------------

def write_shard(path, tokens, header_vocab=None):
    """A uint16 shard; with `header_vocab` (0: llm.c's own) behind a 1024-byte llm.c header."""
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.uint16)
    with open(path, "wb") as f:
        if header_vocab is not None:
            header = np.zeros(256, dtype=np.int32)
            header[:4] = 20240520, 1, len(tokens), header_vocab
            f.write(header.tobytes())
        f.write(tokens.tobytes())
    return path


def test_headerless_shard_needs_a_vocab_and_holds_out_its_tail(tmp_path):
    f = write_shard(tmp_path / "train.bin", range(2000))
    with pytest.raises(DataError, match=r"pass --vocab-size \(e.g. 50257 for the GPT-2 tokenizer\)"):
        load_corpus(f)
    c = load_corpus(f, vocab_size=4000)
    assert c.vocab_size == 4000 and c.train.numel() == 1900 and c.val.numel() == 100
    x, y = BatchSampler(c.val, 16, 2, seed=0).next()
    assert x.min() >= 1900  # the last 5% of the file, in order
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_llmc_header_gives_the_vocab_and_is_skipped(tmp_path):
    import numpy as np

    f = write_shard(tmp_path / "fineweb_train_000001.bin", np.arange(3000) % 700, header_vocab=700)
    c = load_corpus(f)
    assert c.vocab_size == 700 and c.train.numel() + c.val.numel() == 3000
    assert c.train.window(0, 0, 4).tolist() == [0, 1, 2, 3]  # the tokens start after the 1024-byte header
    x, _ = BatchSampler(c.train, 32, 4, seed=1).next()
    assert ((x[:, 1:] - x[:, :-1]) % 700 == 1).all()
    assert load_corpus(f, vocab_size=800).vocab_size == 800  # the argument wins
    with pytest.raises(DataError, match="pass --vocab-size"):
        load_corpus(write_shard(tmp_path / "llmc.bin", range(100), header_vocab=0))  # llm.c leaves it zero


def test_folder_with_val_file_and_samples_never_cross_shards(tmp_path):
    for i in range(3):
        write_shard(tmp_path / f"data_train_{i}.bin", [i + 1] * (1000 * (i + 1)))
    write_shard(tmp_path / "data_val_0.bin", [9] * 500)
    (tmp_path / "README.md").write_text("text files next to shards are ignored")
    c = load_corpus(tmp_path, vocab_size=10)
    assert c.train.numel() == 6000 and c.val.numel() == 500 and "val" in c.val.names[0]
    s = BatchSampler(c.train, 64, 600, seed=5)
    x, y = s.next()
    assert x.shape == y.shape == (600, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x.min(dim=1).values, x.max(dim=1).values)  # one shard per window
    counts = torch.bincount(x[:, 0], minlength=4)[1:].tolist()
    assert counts[0] < counts[1] < counts[2]  # drawn in proportion to length
    state = s.state()
    a = s.next()[0]
    s.set_state(state)
    assert torch.equal(a, s.next()[0]) and torch.equal(x, BatchSampler(c.train, 64, 600, seed=5).next()[0])
    assert len(eval_batches(c.val, 64, 3, 4)) == 3


def test_token_outside_the_vocab_names_the_file(tmp_path):
    write_shard(tmp_path / "train.bin", [5] * 1000)
    write_shard(tmp_path / "val.bin", [1] * 1000)
    c = load_corpus(tmp_path, vocab_size=5)
    with pytest.raises(DataError, match=r"token id 5 in .*train\.bin is outside the vocabulary of 5"):
        BatchSampler(c.train, 8, 2, seed=0).next()


def test_bad_shards_and_vocabs_are_clear_errors(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(DataError, match="empty.bin is empty"):
        load_corpus(tmp_path / "empty.bin", vocab_size=10)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 101)
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        load_corpus(tmp_path / "odd.bin", vocab_size=10)
    f = write_shard(tmp_path / "cut.bin", range(100), header_vocab=200)
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(DataError, match="header says 100 tokens but the file holds 95"):
        load_corpus(f)
    short = write_shard(tmp_path / "short.bin", range(100))
    c = load_corpus(short, vocab_size=100)
    with pytest.raises(DataError, match=r"short\.bin\) is shorter than one block of 129"):
        BatchSampler(c.train, 128, 2, seed=0)
    with pytest.raises(DataError, match="does not fit uint16 token shards"):
        load_corpus(short, vocab_size=70000)
    (tmp_path / "only").mkdir()
    write_shard(tmp_path / "only" / "val.bin", range(100))
    with pytest.raises(DataError, match="none to train on"):
        load_corpus(tmp_path / "only", vocab_size=100)
    (tmp_path / "t.txt").write_text("x" * 1000)
    with pytest.raises(DataError, match=r"--vocab-size applies to token shards; text is read as bytes \(256\)"):
        load_corpus(tmp_path / "t.txt", vocab_size=50257)
    assert load_corpus(tmp_path / "t.txt", vocab_size=256).vocab_size == 256


def test_model_takes_the_data_vocab():
    m = build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16), vocab_size=1000)
    idx = torch.randint(1000, (2, 16))
    logits, loss = m(idx, idx)
    loss.backward()
    assert logits.shape == (2, 16, 1000) and abs(loss.item() - math.log(1000)) < 0.5
    assert m.lm_head.weight is m.wte.weight and m.wte.weight.grad.shape == (1000, 32)


def test_gpt2_small_preset_is_124m_at_the_gpt2_vocab():
    with torch.device("meta"):
        n = build_model(ModelConfig(size="gpt2-small"), vocab_size=50257).num_params()
        n_bytes = build_model(ModelConfig(size="gpt2-small")).num_params()
    assert 123e6 < n < 125e6 and 85e6 < n_bytes < 87e6
