"""Any transformers causal LM as one of the project's models, and the project's GPT as a GPT-2.

`CausalLM` wraps a transformers model built from its config (`build_hf`: a Llama preset's, a
config.json's; nothing downloaded) in the interface the project's loops call: `model(idx, targets)`
returns `(logits, loss)` (the loss the project's GPT computes: mean cross-entropy of the next
token), `generate` samples (`core.sampling`), `block_size` is the context it trains on.

`gpt2_of` is the project's GPT as a `transformers.GPT2LMHeadModel` with the same function: GPT-2's
architecture is the GPT's (pre-LayerNorm blocks with eps 1e-5, learned positions, attention scaled
by 1/sqrt(head size), an MLP of 4 x n_embd, tied embeddings) except for the biases of its four
linear layers per block, which the GPT does not have: they are zeros, and the GELU is the exact
(erf) one, `activation_function="gelu"`, not GPT-2's tanh approximation. The logits agree to float
rounding.

transformers is an optional dependency (the `hf` extra), imported only here and only inside
functions: without it a Llama preset or a config.json is a one-line `ConfigError`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F

from p2p_diloco.core.sampling import sample
from p2p_diloco.core.spec import ModelSpec
from p2p_diloco.errors import ConfigError

INSTALL_HINT = "pip install 'p2p-diloco[hf]'"


def transformers_module(why: str) -> ModuleType:
    """`transformers`, or a one-line `ConfigError` saying that `why` needs it."""
    try:
        return importlib.import_module("transformers")
    except ImportError as e:
        raise ConfigError(f"{why} needs transformers, which is not installed: {INSTALL_HINT}") from e


class CausalLM(nn.Module):
    """A transformers causal LM behind the project's model interface (see the module docstring)."""

    def __init__(self, hf: nn.Module, block_size: int) -> None:
        super().__init__()
        self.hf = hf
        self.block_size = block_size
        self.vocab_size = int(hf.config.vocab_size)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.hf(input_ids=idx, use_cache=False).logits  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8, top_k: int | None = 40,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        return sample(self, idx, max_new_tokens, temperature, top_k, generator)


def _fp32(transformers: ModuleType) -> dict[str, torch.dtype]:
    """The keyword that builds a model in fp32 whatever dtype its config names (`dtype` since transformers 5)."""
    major = int(str(transformers.__version__).split(".")[0])
    return {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}


def hf_config(spec: ModelSpec) -> object:
    """The transformers config object of an `hf` spec; `ConfigError` when transformers cannot make one of it."""
    assert spec.hf_config is not None
    what = f"--model {spec.preset}" if spec.preset else f"a {spec.hf_config.get('model_type')} config.json"
    transformers = transformers_module(what)
    try:
        return transformers.AutoConfig.for_model(**spec.hf_config)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"transformers cannot build a config of {what}: {str(e).splitlines()[0]}") from e


def build_hf(spec: ModelSpec) -> CausalLM:
    """A freshly initialised transformers causal LM of an `hf` spec, in fp32, behind `CausalLM`. Its vocabulary
    must hold the data's, and its positions the context (`ConfigError`, one line)."""
    config = hf_config(spec)
    transformers = transformers_module("a Hugging Face model")
    name = spec.preset or f"this {getattr(config, 'model_type', '?')} config"
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ConfigError(f"{name} is not a causal language model transformers can build "
                          "(AutoModelForCausalLM knows no model of its model_type)")
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < spec.vocab_size:
        raise ConfigError(f"the data's token ids go up to {spec.vocab_size - 1}, beyond the vocabulary of {vocab} of "
                          f"{name}: raise its vocab_size, or prepare the data with the model's tokenizer")
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < spec.block_size:
        raise ConfigError(f"{name} has {positions} positions, fewer than the context of {spec.block_size} "
                          "([model] block_size)")
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, **_fp32(transformers))
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{name} is not a causal language model transformers can build: "
                          f"{str(e).splitlines()[0]}") from e
    return CausalLM(model, spec.block_size)


def gpt2_of(gpt: nn.Module, spec: ModelSpec) -> nn.Module:
    """The project's GPT (`core.model.GPT`, of `spec`) as a `transformers.GPT2LMHeadModel` computing the same
    logits (see the module docstring), its weights copied."""
    assert spec.dims is not None
    transformers = transformers_module("exporting the project's GPT")
    d = spec.dims
    config = transformers.GPT2Config(
        vocab_size=spec.vocab_size, n_positions=d["block_size"], n_embd=d["n_embd"], n_layer=d["n_layer"],
        n_head=d["n_head"], n_inner=4 * d["n_embd"], activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, layer_norm_epsilon=1e-5, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False, tie_word_embeddings=True, bos_token_id=spec.eos_id, eos_token_id=spec.eos_id,
        architectures=["GPT2LMHeadModel"])
    out = transformers.GPT2LMHeadModel(config)
    ours = gpt.state_dict()
    theirs: dict[str, torch.Tensor] = {"transformer.wte.weight": ours["wte.weight"],
                                       "transformer.wpe.weight": ours["wpe.weight"],
                                       "transformer.ln_f.weight": ours["ln_f.weight"],
                                       "transformer.ln_f.bias": ours["ln_f.bias"],
                                       "lm_head.weight": ours["wte.weight"]}
    linear = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for i in range(d["n_layer"]):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            theirs[dst + b + ".weight"], theirs[dst + b + ".bias"] = ours[src + a + ".weight"], ours[src + a + ".bias"]
        for a, b in linear.items():  # GPT-2's Conv1D holds (in, out): the Linear's weight transposed
            w = ours[src + a + ".weight"]
            theirs[dst + b + ".weight"], theirs[dst + b + ".bias"] = w.t().contiguous(), w.new_zeros(w.shape[0])
    out.load_state_dict(theirs, strict=True)
    return out
