"""The `[model]` section: which model an island trains, a preset of the project's GPT, a Llama preset
or a Hugging Face config.json, and its shape (`p2p_diloco.config` takes it in with the other sections).

Plain Python (no torch, no transformers): the file of a config.json is read, never built here
(`core.spec.model_spec` describes the model, `core.hf` builds it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_diloco.choices import HF_CONTEXT, LLAMA_PRESETS, MODEL_PRESETS
from p2p_diloco.errors import ConfigError
from p2p_diloco.errors import require as _require


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model and its shape. `size` picks a named preset (explicit dimensions override it) or a config.json."""

    size: str = "tiny"
    """Named preset of the project's GPT: `tiny` (~1M parameters, tests and CPU demos), `small` (~10-20M) or
    `gpt2-small` (GPT-2's 124M shape at its 50257-token vocabulary, ~86M with bytes); of a Llama (RoPE, RMSNorm,
    SwiGLU, built by transformers, the `hf` extra): `llama-tiny`, `llama-small`, `llama-150m` (`LLAMA_PRESETS`).
    Parameter counts are at the byte vocabulary unless stated: the embedding grows with the data's vocabulary
    (`--vocab-size`). Or the path of a Hugging Face `config.json` (ending in `.json`): any causal LM transformers
    builds from its config (Llama, Qwen2, Mistral, GPT-2...), nothing downloaded, of the file's shape and
    vocabulary (which must hold the data's); it trains on `block_size` tokens, else on its position limit up
    to `HF_CONTEXT`."""
    n_layer: int | None = None
    """Transformer blocks (overrides the preset)."""
    n_head: int | None = None
    """Attention heads per block (overrides the preset)."""
    n_embd: int | None = None
    """Width of the residual stream (overrides the preset); must be divisible by n_head."""
    block_size: int | None = None
    """Context length in tokens, bytes for text data (overrides the preset)."""
    dropout: float = 0.0
    """Dropout probability in attention and MLP (0 for short runs)."""

    def __post_init__(self) -> None:
        _require(self.family is not None, "model", "size",
                 f"one of {sorted({**MODEL_PRESETS, **LLAMA_PRESETS})} or the path of a config.json", self.size)
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            v = getattr(self, name)
            _require(v is None or (isinstance(v, int) and v >= 1), "model", name, "a positive integer", v)
        _require(0.0 <= self.dropout < 1.0, "model", "dropout", "in [0, 1)", self.dropout)
        if self.family == "hf":
            for name in ("n_layer", "n_head", "n_embd"):
                _require(getattr(self, name) is None, "model", name, "unset with a config.json (the file sets the shape)",
                         getattr(self, name))
        dims = self.resolved()
        if self.family != "hf":
            _require(dims["n_embd"] % dims["n_head"] == 0, "model", "n_embd", "divisible by n_head", dims["n_embd"])

    @property
    def family(self) -> str | None:
        """`gpt` (a preset of the project's GPT), `llama` (a Llama preset), `hf` (a config.json); None: neither."""
        if not isinstance(self.size, str):
            return None
        if self.size in MODEL_PRESETS:
            return "gpt"
        return "llama" if self.size in LLAMA_PRESETS else "hf" if self.size.endswith(".json") else None

    def hf_config(self) -> dict[str, Any] | None:
        """The config.json's contents (None for a preset); `ConfigError`, in one line, when it cannot be read
        or is no Hugging Face config (a JSON object naming its `model_type`)."""
        if self.family != "hf":
            return None
        try:
            raw = json.loads(Path(self.size).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ConfigError(f"model.size: cannot read the model config {self.size}: {str(e).splitlines()[0]}") from e
        if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
            raise ConfigError(f"model.size: {self.size} is not a Hugging Face model config (a JSON object with a "
                              "\"model_type\")")
        return raw

    def resolved(self) -> dict[str, int]:
        """The preset with explicit overrides applied: n_layer, n_head, n_embd, block_size (of a config.json,
        block_size and those of the others the file names)."""
        raw = self.hf_config()
        if raw is not None:
            positions = next((raw[k] for k in ("max_position_embeddings", "n_positions", "n_ctx")
                              if isinstance(raw.get(k), int)), None)
            block = self.block_size or min(HF_CONTEXT, positions or HF_CONTEXT)
            _require(positions is None or block <= positions, "model", "block_size",
                     f"at most the config's {positions} positions", block)
            named = {"n_layer": ("num_hidden_layers", "n_layer"), "n_head": ("num_attention_heads", "n_head"),
                     "n_embd": ("hidden_size", "n_embd")}
            dims = {name: next(raw[k] for k in keys if isinstance(raw.get(k), int)) for name, keys in named.items()
                    if any(isinstance(raw.get(k), int) for k in keys)}
            return {**dims, "block_size": block}
        dims = dict(MODEL_PRESETS.get(self.size) or LLAMA_PRESETS[self.size])
        for name in dims:
            if getattr(self, name) is not None:
                dims[name] = getattr(self, name)
        return dims
