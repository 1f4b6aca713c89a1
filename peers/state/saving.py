"""The island's own state on disk: every checkpoint it writes, and the one it resumes from.

A checkpoint holds the whole island: the outer state, the inner optimizer, the scheduler, the
model's buffers and frozen parameters (`ModelExtras`: checkpointed, never averaged), the caller's
own state (`extra_state`), and what it takes to rebuild the model (`core.spec.ModelSpec`, its
tokenizer settled in the run directory: `peers.state.modelfiles`), so that `export` and `generate`
need only the run directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.spec import ModelSpec
from p2p_diloco.errors import CheckpointError
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.state import checkpoint
from p2p_diloco.peers.state.modelfiles import keep_tokenizer

log = logging.getLogger(__name__)


class ModelExtras:
    """The model's state that never travels: buffers and frozen parameters (checkpointed, not averaged)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.state_dict().items() if k not in self._trainable}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise CheckpointError(f"the model's buffers differ from the checkpoint's: "
                                  f"{sorted(set(state) ^ expected)[:4]}")
        self.model.load_state_dict(state, strict=False)


class IslandSaver:
    """Writes the island's checkpoints and resumes it from the last one (see the module docstring)."""

    def __init__(self, run_dir: Path, outer: OuterLoop, identity: Identity, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: Any = None, extra_state: Any = None,
                 spec: ModelSpec | None = None) -> None:
        self.folder, self.outer, self.identity = run_dir / "checkpoints", outer, identity
        self.spec = None if spec is None else keep_tokenizer(run_dir, spec)
        self.parts: dict[str, Any] = {"optimizer": optimizer, "scheduler": scheduler, "model": ModelExtras(model),
                                      "extra": extra_state}

    def save(self, round_: int, own_tokens: int) -> Path | None:
        """Write the whole island atomically; None (and an error logged, the last good checkpoint kept)
        when it would hold non-finite values."""
        meta = {"round": round_, "peer_id": self.identity.peer_id, "model": self.identity.model,
                "run": self.identity.run, "own_tokens": own_tokens,
                **({} if self.spec is None else {"spec": self.spec.to_json()})}
        tensors, meta = checkpoint.pack(self.outer, self.parts, meta)
        try:
            return checkpoint.save(self.folder, tensors, meta)
        except CheckpointError as e:
            log.error("%s; the last good checkpoint stays", e)
            return None

    def resume(self) -> tuple[int, int]:
        """Continue from the last checkpoint: the outer state and every part come back, and the
        identity's run becomes the checkpoint's. Returns its round and own tokens (`CheckpointError`
        if there is none, it is damaged, or it belongs to another model)."""
        path = checkpoint.latest(self.folder)
        if path is None:
            raise CheckpointError(f"--resume given but {self.folder} holds no checkpoint")
        meta = checkpoint.restore(self.outer, self.parts, checkpoint.load(path), path, self.identity.model)
        self.identity.run = str(meta.get("run", self.identity.run))
        log.info("resumed from %s at version %d, round %d", path.name, self.outer.state.version, int(meta["round"]))
        return int(meta["round"]), int(meta.get("own_tokens", 0))
