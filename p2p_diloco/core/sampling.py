"""Sampling text from any of the project's models: temperature and top-k, one token at a time.

A model here is called as `model(idx)` and returns `(logits, loss)` with logits of shape (B, T, V)
and has a `block_size` (the project's GPT, `core.model`; a transformers causal LM behind its
adapter, `core.hf.CausalLM`). No key/value cache: each new token runs the model over the last
`block_size` tokens, which is what a demo's or a check's few hundred tokens need.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def sample(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
           top_k: int | None = 40, generator: torch.Generator | None = None) -> torch.Tensor:
    """The prompt `idx` of shape (B, T) followed by `max_new_tokens` sampled tokens (temperature 0: the likeliest)."""
    block_size = int(getattr(model, "block_size"))
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -block_size:])
        logits = logits[:, -1, :].float() / max(temperature, 1e-5)  # (B, V)
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("inf")
        probs = F.softmax(logits, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return idx
