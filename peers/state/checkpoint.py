"""Atomic island checkpoints: tensors in safetensors, the rest in a small JSON file.

A checkpoint is a folder `ckpt-<version>-<round>/` holding `state.safetensors` (anchor `phi`,
outer momentum `m`, and every tensor of the inner optimizer's, the scheduler's, the model buffers'
and the caller's own state dicts) and `meta.json` (version, tokens, round, the model fingerprint,
those state dicts' other values, the sha256 of the tensor file, and, from `join`, the model's `spec`:
what rebuilds it, `core.spec`, read by `export` and `generate`, absent from older checkpoints, which
resume all the same). Any optimizer works: its
`state_dict()` is stored as it is, not assumed to be AdamW's.
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
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file as st_save_file

from p2p_diloco.core.codecs import all_finite
from p2p_diloco.errors import CheckpointError

FORMAT = 2
ANCHOR = "outer.phi"
"""The anchor's name in a checkpoint's tensors (what a sample or an evaluation loads into a model)."""
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


def _sha256(path: Path, block: int = 16 * 1024 * 1024) -> str:
    """The file's sha256, read a block at a time (a checkpoint of a large model never sits in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def save(folder: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write a checkpoint atomically under `folder`; returns the checkpoint's directory.

    Raises `CheckpointError` (writing nothing) when a floating-point tensor holds NaN or infinite
    values: such a checkpoint could never be resumed, and it would replace the last good one.
    """
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not all_finite(v.detach())]
    if bad:
        raise CheckpointError(f"not writing a checkpoint: non-finite values in {', '.join(bad[:3])}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{int(meta['version']):08d}-{int(meta.get('round', 0)):08d}"
    final, tmp = folder / name, folder / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    state = tmp / "state.safetensors"
    st_save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, state)  # streamed, no copy in memory
    with open(state, "rb+") as f:
        os.fsync(f.fileno())
    full_meta = {**meta, "format": FORMAT, "sha256": _sha256(state)}
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
        digest = _sha256(path / "state.safetensors")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format (expected format {FORMAT})")
    if digest != meta.get("sha256"):
        raise CheckpointError(f"checkpoint {path / 'state.safetensors'} is corrupt (checksum mismatch)")
    try:
        tensors = st_load_file(path / "state.safetensors")
    except (SafetensorError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} cannot be parsed: {e}") from e
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"checkpoint {path} holds non-finite values in {', '.join(bad[:3])}")
    return CheckpointData(tensors, meta)


def _flatten(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able copy of a state dict with every tensor replaced by `{"__tensor__": name}` (the
    tensor goes into `tensors` under that name). Tuples and dicts with int keys survive the trip."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        if not all(k is None or isinstance(k, (str, int, float, bool)) for k in obj):
            raise CheckpointError(f"cannot checkpoint {key}: a dict key is not a string or number")
        return {"__dict__": [[k, _flatten(v, f"{key}.{i}", tensors)] for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot checkpoint {key}: a {type(obj).__name__} (a state dict may hold tensors, "
                          "numbers, strings, lists, tuples and dicts)")


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_unflatten(v, tensors) for v in obj["__tuple__"])
        return {k: _unflatten(v, tensors) for k, v in obj["__dict__"]}
    return obj


def part_state(ck: CheckpointData, name: str) -> Any:
    """The state dict a checkpoint holds of one part (`pack`'s `parts`: "model" for the model's buffers and
    frozen parameters), None when it holds none."""
    states = ck.meta.get("states") or {}
    return _unflatten(states[name], ck.tensors) if name in states else None


def pack(outer, parts: dict[str, Any], meta: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What an island's checkpoint holds: its outer state (`outer`, a `core.island.OuterLoop`) and
    the state dict of every object in `parts` (inner optimizer, scheduler, the model's buffers, the
    caller's own data position...), plus `meta` (round, peer id, model fingerprint...)."""
    s = outer.state
    tensors = {ANCHOR: s.phi, "outer.m": s.m}
    states = {name: _flatten(obj.state_dict(), name, tensors) for name, obj in parts.items() if obj is not None}
    return tensors, {**meta, "version": s.version, "tokens": s.tokens, "states": states}


def restore(outer, parts: dict[str, Any], ck: CheckpointData, path: Path, fingerprint: str) -> dict[str, Any]:
    """Put a checkpoint back into an island (outer state and every part); returns its meta.

    Raises `CheckpointError` naming the file when it belongs to another model or does not fit.
    """
    t, meta = ck.tensors, ck.meta
    if meta.get("model") != fingerprint:
        raise CheckpointError(f"checkpoint {path} is for another model (fingerprint {meta.get('model')!r}, "
                              f"this model's is {fingerprint!r})")
    s = outer.state
    try:
        phi, m = t[ANCHOR], t["outer.m"]
        if phi.numel() != s.phi.numel() or m.numel() != s.phi.numel():
            raise CheckpointError(f"checkpoint {path} holds {phi.numel()} parameters, the model {s.phi.numel()}")
        s.phi, s.m = phi.to(s.phi.device).clone(), m.to(s.phi.device).clone()
        s.version, s.tokens = int(meta["version"]), int(meta["tokens"])
        for name, obj in parts.items():
            if obj is not None and name in meta["states"]:
                obj.load_state_dict(_unflatten(meta["states"][name], t))
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} does not match this island: {type(e).__name__}: {e}") from e
    outer.begin_round()
    return meta
