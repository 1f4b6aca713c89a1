"""The files of a run directory that say what its model is: the data's tokenizer, copied there once, and
the model spec every checkpoint of `join` holds (`core.spec`), read back for `export` and `generate`.

The tokenizer is `RUN_DIR/tokenizer.json` (the Hugging Face tokenizers format), copied from beside the
token shards (their `dataset.json` names it, `core.sidecar`) when the island starts, so that the run
directory alone rebuilds the model and its text; the spec keeps its name and sha256. A checkpoint
written before checkpoints described their model has no spec: it resumes, but it cannot be exported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path

from p2p_diloco.core.spec import ModelSpec
from p2p_diloco.errors import ConfigError
from p2p_diloco.peers.state.checkpoint import CheckpointData

log = logging.getLogger(__name__)
TOKENIZER_NAME = "tokenizer.json"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def keep_tokenizer(run_dir: Path, spec: ModelSpec) -> ModelSpec:
    """`spec` with its tokenizer settled in `run_dir`: the data's tokenizer.json copied to
    `run_dir/tokenizer.json` (atomically, unless the same one is there already), named relative to the
    run directory, its sha256 kept. A spec without a tokenizer, or one settled already, comes back as it is."""
    if spec.tokenizer is None or not Path(spec.tokenizer).is_absolute():
        return spec
    source, target = Path(spec.tokenizer), Path(run_dir) / TOKENIZER_NAME
    try:
        blob = source.read_bytes()
        digest = hashlib.sha256(blob).hexdigest()
        if not (target.is_file() and file_sha256(target) == digest):
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_file():
                log.warning("%s differs from the data's tokenizer %s: replacing it", target, source)
            tmp = target.with_name(f".{TOKENIZER_NAME}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, target)
    except OSError as e:
        raise ConfigError(f"cannot copy the data's tokenizer {source} into {run_dir}: {e}") from e
    return dataclasses.replace(spec, tokenizer=TOKENIZER_NAME, tokenizer_sha256=digest)


def spec_of(ck: CheckpointData, path: Path) -> ModelSpec:
    """The model spec a checkpoint holds; a one-line `ConfigError` for a checkpoint from before specs."""
    raw = ck.meta.get("spec")
    if raw is None:
        raise ConfigError(f"checkpoint {path} does not say which model it holds (written before checkpoints described "
                          "their model, or by the Python API around a model of its own): it can be resumed, not "
                          "exported or sampled; the next checkpoint join writes of it can be")
    return ModelSpec.from_json(raw)


def tokenizer_file(run_dir: Path, spec: ModelSpec) -> Path | None:
    """The run directory's tokenizer.json that `spec` names (None: it names none); `ConfigError` when it is
    missing or is not the one the model was trained with."""
    if spec.tokenizer is None:
        return None
    path = Path(spec.tokenizer) if Path(spec.tokenizer).is_absolute() else Path(run_dir) / spec.tokenizer
    if not path.is_file():
        raise ConfigError(f"the model's tokenizer {path} is missing")
    if spec.tokenizer_sha256 is not None and file_sha256(path) != spec.tokenizer_sha256:
        raise ConfigError(f"{path} is not the tokenizer this checkpoint was trained with (its sha256 differs)")
    return path
