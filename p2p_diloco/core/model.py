"""A GPT in the style of nanoGPT's `model.py`, its vocabulary set by the data.

Pre-LayerNorm transformer blocks, causal self-attention through
`torch.nn.functional.scaled_dot_product_attention`, learned positional embeddings and a language
model head tied to the token embedding. The vocabulary comes from the corpus
(`p2p_diloco.core.data.Corpus.vocab_size`): the 256 byte values for text, which needs no tokenizer
and gives a loss in nats per byte, or the tokenizer's vocabulary for token shards (nats per token).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from p2p_diloco.config import ModelConfig
from p2p_diloco.core.sampling import sample
from p2p_diloco.core.spec import ModelSpec, model_spec

VOCAB_SIZE = 256
"""The byte vocabulary, the default for text data."""


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, n_layer: int, n_head: int, n_embd: int, block_size: int, dropout: float = 0.0,
                 vocab_size: int = VOCAB_SIZE) -> None:
        super().__init__()
        self.block_size, self.vocab_size = block_size, vocab_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled init of residual projections (GPT-2)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        assert T <= self.block_size, f"sequence of {T} exceeds block size {self.block_size}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, self.vocab_size), targets.reshape(-1))
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8, top_k: int | None = 40,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample `max_new_tokens` tokens after the prompt `idx` of shape (B, T) (`core.sampling.sample`)."""
        return sample(self, idx, max_new_tokens, temperature, top_k, generator)


def build_model(cfg: ModelConfig, vocab_size: int = VOCAB_SIZE) -> nn.Module:
    """The model a `ModelConfig` names (a preset plus explicit overrides, or a config.json) for the data's
    vocabulary: the project's GPT, or a transformers causal LM behind `core.hf.CausalLM`."""
    return from_spec(model_spec(cfg, vocab_size))


def from_spec(spec: ModelSpec) -> nn.Module:
    """The model a `ModelSpec` describes (a checkpoint's, or `model_spec`'s), freshly initialised from torch's
    current seed. A transformers model without transformers installed is a one-line `ConfigError`."""
    if spec.family == "gpt":
        assert spec.dims is not None
        return GPT(**spec.dims, dropout=spec.dropout, vocab_size=spec.vocab_size)
    from p2p_diloco.core.hf import build_hf

    return build_hf(spec)
