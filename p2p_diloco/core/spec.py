"""What it takes to build a model again: `ModelSpec`, written into every checkpoint of `join`.

A spec names the model's family and its whole shape: the project's GPT (`gpt`: its preset and
dimensions) or a transformers causal LM (`hf`: the full config dict transformers builds it from, a
Llama preset's made here, a config.json's as the file has it); the vocabulary the data has; the
context it trains on; and the tokenizer of the data, if the data names one (`core.sidecar`), as a
`tokenizer.json` in the Hugging Face tokenizers format. `export` and `generate` rebuild the model
from it with nothing but the run directory. Plain Python and JSON: no torch, no transformers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from p2p_diloco.config import LLAMA_PRESETS, ModelConfig
from p2p_diloco.errors import ConfigError

SPEC_FORMAT = 1
FAMILIES = ("gpt", "hf")
LLAMA_MLP_MULTIPLE = 64
"""A Llama preset's MLP width: 8/3 of n_embd (SwiGLU's three matrices cost what GELU's two of 4 x n_embd do),
rounded up to a multiple of this."""


@dataclass(frozen=True)
class ModelSpec:
    """A model as `join` built it (see the module docstring)."""

    family: str
    """`gpt` (the project's GPT, `core.model`) or `hf` (a transformers causal LM, `core.hf`)."""
    preset: str | None
    """The preset's name (`tiny`, `llama-tiny`...), None for a config.json."""
    vocab_size: int
    """The data's vocabulary: the model's own for a preset; a config.json's may be larger."""
    block_size: int
    """The context the model trains on."""
    dims: dict[str, int] | None = None
    """`gpt`: n_layer, n_head, n_embd, block_size."""
    hf_config: dict[str, object] | None = None
    """`hf`: the config, as `transformers.AutoConfig.for_model(**hf_config)` takes it."""
    dropout: float = 0.0
    tokenizer: str | None = None
    """The data's tokenizer.json: its path before the island settles it in its run directory
    (`peers.state.rundir.keep_tokenizer`), then its name there; None: bytes, or ids without a tokenizer."""
    tokenizer_sha256: str | None = None
    eos_id: int | None = None
    """The data's end-of-document id, when it names one."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"model spec: family {self.family!r} is not one of {FAMILIES}")
        if (self.family == "gpt") != (self.dims is not None) or (self.family == "hf") != (self.hf_config is not None):
            raise ConfigError(f"model spec: a {self.family} model needs {'dims' if self.family == 'gpt' else 'hf_config'}")
        for name in ("vocab_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model spec: {name} must be a positive integer, got {value!r}")

    def to_json(self) -> dict[str, object]:
        """The spec as a JSON object (a checkpoint's `spec`)."""
        return {"format": SPEC_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, raw: object) -> ModelSpec:
        """A spec read back; `ConfigError` in one line when it is not one."""
        if not isinstance(raw, dict) or raw.get("format") != SPEC_FORMAT:
            raise ConfigError(f"model spec of an unknown format (expected format {SPEC_FORMAT})")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as e:
            raise ConfigError(f"model spec is malformed: {e}") from e


def llama_config(dims: dict[str, int], vocab_size: int, dropout: float = 0.0,
                 eos_id: int | None = None) -> dict[str, object]:
    """A Llama preset's `transformers.LlamaConfig` as a dict (RoPE, RMSNorm, SwiGLU, tied embeddings)."""
    mlp = math.ceil(8 * dims["n_embd"] / 3 / LLAMA_MLP_MULTIPLE) * LLAMA_MLP_MULTIPLE
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
            "hidden_size": dims["n_embd"], "intermediate_size": mlp, "num_hidden_layers": dims["n_layer"],
            "num_attention_heads": dims["n_head"], "num_key_value_heads": dims["n_head"],
            "max_position_embeddings": dims["block_size"], "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False, "attention_dropout": dropout,
            "initializer_range": 0.02, "tie_word_embeddings": True,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": None}


def model_spec(cfg: ModelConfig, vocab_size: int, tokenizer: Path | None = None, eos_id: int | None = None) -> ModelSpec:
    """The spec of the model `cfg` names, for data of `vocab_size` (and its tokenizer, its end-of-document id)."""
    dims = cfg.resolved()
    common = {"vocab_size": vocab_size, "block_size": dims["block_size"], "dropout": cfg.dropout,
              "tokenizer": None if tokenizer is None else str(tokenizer), "eos_id": eos_id}
    if cfg.family == "gpt":
        return ModelSpec("gpt", cfg.size, dims=dims, **common)
    if cfg.family == "llama":
        assert cfg.size in LLAMA_PRESETS
        return ModelSpec("hf", cfg.size, hf_config=llama_config(dims, vocab_size, cfg.dropout, eos_id), **common)
    return ModelSpec("hf", None, hf_config=cfg.hf_config(), **common)
