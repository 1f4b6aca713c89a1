"""Any transformers causal LM from its config (`core.hf`, `core.spec`): Llama presets and config.json models
build, train through the project's inner loop, and are refused in one line where they cannot run."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.config import ModelConfig, TrainConfig
from p2p_diloco.core.inner import InnerLoop
from p2p_diloco.core.model import GPT, build_model, from_spec
from p2p_diloco.core.params import fingerprint, weights_digest
from p2p_diloco.core.spec import ModelSpec, model_spec
from p2p_diloco.errors import ConfigError

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(60)

QWEN2 = {"model_type": "qwen2", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}


def config_json(tmp_path, raw, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return str(path)


def trains(model: torch.nn.Module, vocab: int = 256, steps: int = 4) -> list[float]:
    loop = InnerLoop(model, TrainConfig(batch_size=2, lr=3e-3, warmup_steps=1, compile="off"))
    x = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(0))
    return [float(loop.train_step(x[:, :-1], x[:, 1:])) for _ in range(steps)]


def test_llama_tiny_is_a_llama_that_trains_through_the_inner_loop_and_starts_alike_on_every_island():
    cfg = ModelConfig(size="llama-tiny", block_size=16)
    torch.manual_seed(0)
    model = build_model(cfg, 256)
    hf = model.hf
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.hidden_act == "silu"
    assert (hf.config.num_hidden_layers, hf.config.hidden_size, hf.config.intermediate_size) == (2, 64, 192)
    assert type(hf.model.norm).__name__ == "LlamaRMSNorm" and hf.config.tie_word_embeddings
    assert model.block_size == 16 and model.vocab_size == 256 and next(model.parameters()).dtype == torch.float32
    logits, loss = model(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    assert logits.shape == (1, 5, 256) and loss.ndim == 0
    losses = trains(model)
    assert losses[-1] < losses[0]  # the same batch: it learns
    assert model.generate(torch.zeros(1, 2, dtype=torch.long), 3).shape == (1, 5)
    torch.manual_seed(0)
    again = build_model(cfg, 256)  # the same seed, the same weights: one run, one model fingerprint
    assert fingerprint(again) == fingerprint(build_model(cfg, 256))
    vec = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    torch.manual_seed(0)
    assert weights_digest(vec(again)) == weights_digest(vec(build_model(cfg, 256)))


@pytest.mark.parametrize("raw, family", [(QWEN2, "Qwen2ForCausalLM"), (GPT2, "GPT2LMHeadModel")])
def test_a_config_json_builds_its_model_at_its_own_vocabulary_and_trains(tmp_path, raw, family):
    cfg = ModelConfig(size=config_json(tmp_path, raw), block_size=16)
    assert cfg.family == "hf" and cfg.resolved()["block_size"] == 16
    spec = model_spec(cfg, 256)
    assert spec.family == "hf" and spec.preset is None and spec.hf_config == raw
    model = from_spec(ModelSpec.from_json(json.loads(json.dumps(spec.to_json()))))  # a checkpoint's round trip
    assert type(model.hf).__name__ == family and model.vocab_size == raw["vocab_size"]
    losses = trains(model)
    assert losses[-1] < losses[0]


def test_a_config_json_trains_on_its_position_limit_up_to_1024_unless_block_size_says(tmp_path):
    assert ModelConfig(size=config_json(tmp_path, QWEN2)).resolved() == {"n_layer": 2, "n_head": 4, "n_embd": 32,
                                                                          "block_size": 64}
    assert ModelConfig(size=config_json(tmp_path, {**QWEN2, "max_position_embeddings": 32768})).resolved()["block_size"] == 1024
    with pytest.raises(ConfigError, match="block_size must be at most the config's 64 positions"):
        ModelConfig(size=config_json(tmp_path, QWEN2), block_size=128)


@pytest.mark.parametrize("raw, message", [
    ("{not json", "cannot read the model config"),
    ([1, 2], "is not a Hugging Face model config"),
    ({"hidden_size": 8}, "is not a Hugging Face model config"),
])
def test_a_bad_config_json_is_one_config_error(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(size=config_json(tmp_path, raw))


def test_what_a_config_json_cannot_be(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the model config"):
        ModelConfig(size=str(tmp_path / "absent.json"))
    with pytest.raises(ConfigError, match="n_layer must be unset with a config.json"):
        ModelConfig(size=config_json(tmp_path, QWEN2), n_layer=3)
    with pytest.raises(ConfigError, match="transformers cannot build a config"):
        build_model(ModelConfig(size=config_json(tmp_path, {"model_type": "no-such-model"})), 256)
    with pytest.raises(ConfigError, match="not a causal language model"):
        build_model(ModelConfig(size=config_json(tmp_path, {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1,
                                                                "num_attention_heads": 2, "intermediate_size": 64}),
                                block_size=16), 256)
    with pytest.raises(ConfigError, match="model.size must be one of"):
        ModelConfig(size="llama-huge")


def test_the_datas_ids_must_fit_the_models_vocabulary(tmp_path):
    cfg = ModelConfig(size=config_json(tmp_path, QWEN2))
    assert build_model(cfg, 300).vocab_size == 300  # a vocabulary as large as the data's is enough
    with pytest.raises(ConfigError, match=r"token ids go up to 511, beyond the vocabulary of 300"):
        build_model(cfg, 512)


def test_presets_of_the_projects_gpt_stay_the_projects_gpt():
    assert isinstance(build_model(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)), GPT)
    spec = model_spec(ModelConfig(size="tiny", n_layer=1), 300)
    assert spec.family == "gpt" and spec.dims == {"n_layer": 1, "n_head": 4, "n_embd": 128, "block_size": 128}
    assert from_spec(spec).vocab_size == 300


def test_without_transformers_a_llama_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"--model llama-tiny needs transformers, which is not installed: pip install"):
        build_model(ModelConfig(size="llama-tiny"), 256)
    data = tmp_path / "data.txt"
    data.write_text("print('hello')\n" * 300)
    out = CliRunner().invoke(main, ["join", "--model", "llama-tiny", "--data", str(data), "--run-dir",
                                    str(tmp_path / "run"), "--max-rounds", "1", "--discovery", "zmq", "--quiet"])
    assert out.exit_code == 2, out.output
    assert "needs transformers" in out.output and len(out.output.strip().splitlines()) == 1, out.output


@pytest.mark.parametrize("model, message", [
    ("bad", "is neither a preset"),
    ("{tmp}/broken.json", "cannot read the model config"),
    ("{tmp}/qwen.json", "beyond the vocabulary of 100"),
])
def test_join_refuses_a_model_it_cannot_build_in_one_line(tmp_path, model, message):
    config_json(tmp_path, "{", "broken.json")
    config_json(tmp_path, {**QWEN2, "vocab_size": 100}, "qwen.json")
    data = tmp_path / "data.txt"
    data.write_text("print('hello')\n" * 300)
    out = CliRunner().invoke(main, ["join", "--model", model.format(tmp=tmp_path), "--data", str(data), "--run-dir",
                                    str(tmp_path / "run"), "--max-rounds", "1", "--discovery", "zmq", "--quiet"])
    assert out.exit_code == 2, out.output
    assert message in out.output and out.output.strip().startswith(("Error", "Usage")), out.output
    assert len([line for line in out.output.splitlines() if line.startswith("Error")]) == 1, out.output
