"""Text sampled from a run directory's latest checkpoint, or from a folder `export` wrote (`p2p-diloco generate`).

A run directory's model is rebuilt from its checkpoint (`peers.state.export.load_run_model`); an exported
folder is loaded with `transformers.AutoModelForCausalLM.from_pretrained`. Text becomes ids and back
through the tokenizer.json beside the model (Hugging Face tokenizers) or, where there is none, as the
256 byte values, as the demo's sample does; a model of another vocabulary without a tokenizer cannot
read text, which is a one-line `ConfigError`. Sampling is `core.sampling.sample` (temperature, top-k).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from p2p_diloco.choices import HF_CONTEXT
from p2p_diloco.core.device import resolve_device
from p2p_diloco.core.sampling import sample
from p2p_diloco.errors import ConfigError

BYTE_VOCAB = 256


@dataclass(frozen=True)
class SampleSettings:
    """How `generate` samples."""

    max_new_tokens: int = 200
    temperature: float = 0.8
    """0: the likeliest token each time."""
    top_k: int | None = 40
    """Sample among the k likeliest tokens (None: all)."""
    seed: int = 0


class TextCodec:
    """Text to ids and back: a tokenizer.json, or the 256 byte values (`tokenizer` None)."""

    def __init__(self, tokenizer: Path | None, vocab_size: int, where: Path) -> None:
        if tokenizer is None and vocab_size != BYTE_VOCAB:
            raise ConfigError(f"{where} has no tokenizer and a vocabulary of {vocab_size}: only a byte-level model "
                              f"({BYTE_VOCAB}) reads text without one (prepare the data with a tokenizer)")
        self.tok = None
        if tokenizer is not None:
            try:
                tokenizers = importlib.import_module("tokenizers")
            except ImportError as e:
                raise ConfigError("reading text with the model's tokenizer needs tokenizers, which is not "
                                  "installed: pip install 'p2p-diloco[hf]'") from e
            self.tok = tokenizers.Tokenizer.from_file(str(tokenizer))

    def encode(self, text: str) -> list[int]:
        return list(text.encode()) if self.tok is None else list(self.tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        if self.tok is None:  # (a config.json's model may hold more ids than the bytes it was trained on)
            return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")
        return self.tok.decode(ids)


def is_exported(path: Path) -> bool:
    """A model folder (`export`'s, or any Hugging Face one) rather than a run directory."""
    return (path / "config.json").is_file() and not (path / "checkpoints").is_dir()


def _exported(folder: Path) -> tuple[torch.nn.Module, TextCodec]:
    from p2p_diloco.core.hf import CausalLM, transformers_module

    transformers = transformers_module("sampling an exported model")
    transformers.utils.logging.disable_progress_bar()
    major = int(str(transformers.__version__).split(".")[0])
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            folder, **({"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the model in {folder}: {str(e).splitlines()[0]}") from e
    positions = getattr(hf.config, "max_position_embeddings", None)
    model = CausalLM(hf, positions if isinstance(positions, int) else HF_CONTEXT)
    tokenizer = folder / "tokenizer.json"
    return model.eval(), TextCodec(tokenizer if tokenizer.is_file() else None, model.vocab_size, folder)


def load_for_sampling(source: Path, given: Path | None = None) -> tuple[torch.nn.Module, TextCodec]:
    """The model (eval mode, CPU) and its text codec: of an exported folder, else of a run directory's latest
    checkpoint (or `given`)."""
    from p2p_diloco.peers.state.export import load_run_model

    if is_exported(source) and given is None:
        return _exported(source)
    run = load_run_model(source, given)
    return run.model, TextCodec(run.tokenizer, run.spec.vocab_size, source)


def generate_text(source: Path, prompt: str, settings: SampleSettings = SampleSettings(), given: Path | None = None,
                  device: str = "cpu") -> str:
    """The prompt and what the model writes after it (see the module docstring)."""
    model, codec = load_for_sampling(Path(source), given)
    ids = codec.encode(prompt)
    if not ids:
        raise ConfigError("--prompt is empty: the model needs at least one token to go on from")
    where = resolve_device(device)
    model = model.to(where)
    idx = torch.tensor([ids], dtype=torch.long, device=where)
    generator = torch.Generator(device=where).manual_seed(settings.seed)
    top_k = settings.top_k if settings.temperature > 0 else 1
    out = sample(model, idx, settings.max_new_tokens, max(settings.temperature, 1e-5), top_k, generator)
    return codec.decode(out[0].tolist())
