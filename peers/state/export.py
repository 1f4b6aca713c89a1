"""A run directory's model as a Hugging Face model folder (`p2p-diloco export`), and the model read back.

`load_run_model` rebuilds the model a checkpoint describes (its spec, `core.spec`) with the
checkpoint's anchor (the weights the swarm agreed on at its last round) and the model's buffers.
`export_run` writes it where `transformers.AutoModelForCausalLM.from_pretrained` loads it with no
custom code: `config.json` and `model.safetensors` (a transformers model through its own
`save_pretrained`; the project's GPT as the `GPT2LMHeadModel` that computes the same logits,
`core.hf.gpt2_of`), and the tokenizer's files when the data had a tokenizer
(`PreTrainedTokenizerFast` around the run directory's tokenizer.json).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from p2p_diloco.core.island import load_vector
from p2p_diloco.core.model import from_spec
from p2p_diloco.core.params import trainable_parameters
from p2p_diloco.core.spec import ModelSpec
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.state import checkpoint
from p2p_diloco.peers.state.modelfiles import spec_of, tokenizer_file
from p2p_diloco.peers.state.saving import ModelExtras

log = logging.getLogger(__name__)
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""What an export writes, or an earlier one may have: removed from OUT first under `--force`."""


@dataclass(frozen=True)
class RunModel:
    """A checkpoint's model, rebuilt: its spec, the model (the project's interface, `model(idx) -> (logits,
    loss)`, in eval mode, on the CPU), the tokenizer.json it reads text with (None: bytes or bare ids) and
    the checkpoint it came from."""

    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: Path | None
    checkpoint: Path


@dataclass(frozen=True)
class Exported:
    """What `export_run` wrote."""

    out: Path
    files: tuple[str, ...]
    architecture: str
    """The transformers class that loads it (`GPT2LMHeadModel`, `LlamaForCausalLM`...)."""
    checkpoint: Path


def checkpoint_of(run_dir: Path, given: Path | None = None) -> Path:
    """The checkpoint to read: `given`, else the run directory's latest (`checkpoints/latest`); `ConfigError`
    when there is none."""
    if given is not None:
        if not (Path(given) / "meta.json").is_file():
            raise ConfigError(f"--checkpoint {given} is not a checkpoint folder (it has no meta.json)")
        return Path(given)
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist")
    path = checkpoint.latest(Path(run_dir) / "checkpoints")
    if path is None:
        raise ConfigError(f"{run_dir} holds no checkpoint (checkpoints/latest): is it a run directory of join?")
    return path


def load_run_model(run_dir: Path, given: Path | None = None) -> RunModel:
    """The model of a run directory's latest checkpoint (or of `given`), rebuilt (see the module docstring)."""
    path = checkpoint_of(run_dir, given)
    ck = checkpoint.load(path)
    spec = spec_of(ck, path)
    tokenizer = tokenizer_file(Path(run_dir), spec)
    model = from_spec(spec)
    anchor = ck.tensors[checkpoint.ANCHOR]
    expected = sum(p.numel() for p in trainable_parameters(model))
    if anchor.numel() != expected:
        raise ConfigError(f"checkpoint {path} holds {anchor.numel()} weights, its model {expected}")
    load_vector(model, anchor)
    extras = checkpoint.part_state(ck, "model")
    if extras:
        ModelExtras(model).load_state_dict(extras)
    return RunModel(spec, model.eval(), tokenizer, path)


def check_out(out: Path, force: bool) -> None:
    """OUT may be written: absent, an empty folder, or any folder under `force`; else a one-line `ConfigError`."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"{out} exists and is not empty: choose another folder, or --force to write over it")


def export_run(run_dir: Path, out: Path, given: Path | None = None, force: bool = False) -> Exported:
    """Write the model of the run directory's latest checkpoint (or of `given`) as a Hugging Face model folder."""
    from p2p_diloco.core.hf import CausalLM, gpt2_of, transformers_module

    out = Path(out)
    check_out(out, force)
    run = load_run_model(run_dir, given)
    transformers = transformers_module("export")
    transformers.utils.logging.disable_progress_bar()
    hf = run.model.hf if isinstance(run.model, CausalLM) else gpt2_of(run.model, run.spec)
    out.mkdir(parents=True, exist_ok=True)
    for name in HF_FILES:
        (out / name).unlink(missing_ok=True)
    for stale in out.glob("model-*-of-*.safetensors"):
        stale.unlink()
    hf.save_pretrained(out)
    if run.tokenizer is not None:
        _save_tokenizer(transformers, run.tokenizer, run.spec, out)
    files = tuple(sorted(p.name for p in out.iterdir() if p.is_file()))
    return Exported(out, files, type(hf).__name__, run.checkpoint)


def _save_tokenizer(transformers: ModuleType, path: Path, spec: ModelSpec, out: Path) -> None:
    """The tokenizer.json, wrapped as `PreTrainedTokenizerFast` (its end-of-document token named), saved in `out`."""
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), model_max_length=spec.block_size)
    if spec.eos_id is not None:
        eos = tok.convert_ids_to_tokens(spec.eos_id)
        if eos is not None:
            tok.eos_token = eos
    tok.save_pretrained(out)
