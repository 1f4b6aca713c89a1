"""Atomic island checkpoints: tensors in safetensors, the rest in a small JSON file.

A checkpoint is a folder `ckpt-<version>/` holding `state.safetensors` (model weights, anchor
`phi`, outer momentum `m`, last pseudo-gradient, the inner AdamW moments) and `meta.json`
(version, tokens, inner step, round, sampler state, config, and the sha256 of the tensor file).
It is written to a temporary folder, fsynced, and renamed into place; `latest` names the newest
one, replaced the same way. A checkpoint that fails its checksum or cannot be parsed raises
`CheckpointError` naming the file: a corrupt checkpoint never turns into a silent fresh start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from p2p_diloco.errors import CheckpointError

FORMAT = 1
KEEP = 2  # older checkpoints beyond this many are removed


@dataclass
class CheckpointData:
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, blob: bytes) -> None:
    with open(path, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def save(folder: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write a checkpoint atomically under `folder`; returns the checkpoint's directory."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{int(meta['version']):08d}-{int(meta.get('round', 0)):08d}"
    final, tmp = folder / name, folder / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    blob = st_save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    _write(tmp / "state.safetensors", blob)
    full_meta = {**meta, "format": FORMAT, "sha256": hashlib.sha256(blob).hexdigest()}
    _write(tmp / "meta.json", json.dumps(full_meta, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    link_tmp = folder / ".latest.tmp"
    _write(link_tmp, name.encode())
    os.replace(link_tmp, folder / "latest")
    _fsync_dir(folder)
    for old in sorted(p for p in folder.glob("ckpt-*") if p.name != name)[:-(KEEP - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(folder: str | Path) -> Path | None:
    """The newest checkpoint's directory, or None when `folder` holds none."""
    pointer = Path(folder) / "latest"
    if not pointer.exists():
        return None
    path = Path(folder) / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def load(path: str | Path) -> CheckpointData:
    """Read and verify one checkpoint directory; raises `CheckpointError` when it is damaged."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        blob = (path / "state.safetensors").read_bytes()
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format (expected format {FORMAT})")
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise CheckpointError(f"checkpoint {path / 'state.safetensors'} is corrupt (checksum mismatch)")
    try:
        tensors = st_load(blob)
    except (SafetensorError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} cannot be parsed: {e}") from e
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"checkpoint {path} holds non-finite values in {', '.join(bad[:3])}")
    return CheckpointData(tensors, meta)


def pack_island(island, round_: int, peer_id: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What an island's checkpoint holds: outer state, inner AdamW moments, sampler position."""
    tensors = {"phi": island.state.phi, "m": island.state.m, "delta": island.state.delta,
               "sampler_state": island.sampler.state()}
    opt_steps = {}
    for i, p in enumerate(p for g in island.inner.optimizer.param_groups for p in g["params"]):
        st = island.inner.optimizer.state.get(p)
        if st:
            tensors[f"opt.{i}.exp_avg"], tensors[f"opt.{i}.exp_avg_sq"] = st["exp_avg"], st["exp_avg_sq"]
            opt_steps[str(i)] = float(st["step"])
    meta = {"version": island.state.version, "tokens": island.state.tokens, "round": round_,
            "inner_step": island.inner.step, "opt_steps": opt_steps, "peer_id": peer_id}
    return tensors, meta


def restore_island(island, ck: CheckpointData, path: Path) -> int:
    """Put a checkpoint back into an island; returns the round it was taken at."""
    t, meta = ck.tensors, ck.meta
    if t["phi"].numel() != island.state.phi.numel():
        raise CheckpointError(f"checkpoint {path} is for a model of {t['phi'].numel()} parameters, "
                              f"not {island.state.phi.numel()}")
    try:
        island.state.phi, island.state.m, island.state.delta = t["phi"].clone(), t["m"].clone(), t["delta"].clone()
        island.state.version, island.state.tokens = int(meta["version"]), int(meta["tokens"])
        optimizer = island.inner.optimizer
        state = {}
        for i in range(sum(len(g["params"]) for g in optimizer.param_groups)):
            if str(i) in meta["opt_steps"]:
                state[i] = {"step": torch.tensor(meta["opt_steps"][str(i)]), "exp_avg": t[f"opt.{i}.exp_avg"].clone(),
                            "exp_avg_sq": t[f"opt.{i}.exp_avg_sq"].clone()}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
        island.inner.step = int(meta["inner_step"])
        island.sampler.set_state(t["sampler_state"])
        round_ = int(meta["round"])
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path} does not match this island: {e}") from e
    island.begin_round()
    return round_
