import pytest
import torch

from p2p_diloco.config import ModelConfig
from p2p_diloco.core.data import BatchSampler, load_corpus
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
