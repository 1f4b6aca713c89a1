import json

import pytest
import torch
from p2p_diloco.peers.state import checkpoint

from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.core.data import BatchSampler
from p2p_diloco.core.island import Island
from p2p_diloco.core.model import build_model
from p2p_diloco.errors import CheckpointError

SMALL = ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16)


def island(seed=0):
    torch.manual_seed(0)
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    return Island("x", build_model(SMALL), TrainConfig(batch_size=2, warmup_steps=1), DiLoCoConfig(local_steps=2),
                  BatchSampler(data, 16, 2, seed))


class Position:
    """The island's data position and schedule step, checkpointed as a caller's own state is."""

    def __init__(self, isl):
        self.isl = isl

    def state_dict(self):
        return {"sampler": self.isl.sampler.state(), "inner_step": self.isl.inner.step}

    def load_state_dict(self, state):
        self.isl.sampler.set_state(state["sampler"])
        self.isl.inner.step = state["inner_step"]


def parts(isl, scheduler=None):
    return {"optimizer": isl.inner.optimizer, "scheduler": scheduler, "extra": Position(isl)}


def test_roundtrip_restores_the_whole_island(tmp_path):
    a = island()
    sched_a = torch.optim.lr_scheduler.StepLR(a.inner.optimizer, step_size=2, gamma=0.5)
    for _ in range(3):
        a.inner_step()
        sched_a.step()
    a.end_round([])
    tensors, meta = checkpoint.pack(a, parts(a, sched_a), {"round": 7, "model": "f" * 16})
    path = checkpoint.save(tmp_path, tensors, meta)
    assert checkpoint.latest(tmp_path) == path
    b = island(seed=99)
    sched_b = torch.optim.lr_scheduler.StepLR(b.inner.optimizer, step_size=2, gamma=0.5)
    assert checkpoint.restore(b, parts(b, sched_b), checkpoint.load(path), path, "f" * 16)["round"] == 7
    assert torch.equal(a.state.phi, b.state.phi) and torch.equal(a.state.m, b.state.m)
    assert (a.state.version, a.state.tokens, a.inner.step) == (b.state.version, b.state.tokens, b.inner.step)
    assert sched_a.state_dict() == sched_b.state_dict()
    # the next inner step is identical: same weights, same Adam moments, same data position
    assert a.inner_step() == b.inner_step()
    assert torch.equal(a.params_vector(), b.params_vector())


def test_any_optimizer_state_round_trips(tmp_path):
    """Not only AdamW: SGD with momentum and int-keyed state, tuples and None survive the JSON side."""
    a = island()
    a.inner.optimizer = torch.optim.SGD(a.model.parameters(), lr=0.1, momentum=0.9)
    a.inner_step()
    tensors, meta = checkpoint.pack(a, {"optimizer": a.inner.optimizer}, {"round": 1, "model": "0" * 16})
    path = checkpoint.save(tmp_path, tensors, meta)
    b = island()
    b.inner.optimizer = torch.optim.SGD(b.model.parameters(), lr=0.5, momentum=0.9)
    checkpoint.restore(b, {"optimizer": b.inner.optimizer}, checkpoint.load(path), path, "0" * 16)
    sa, sb = a.inner.optimizer.state_dict(), b.inner.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert all(torch.equal(sa["state"][k]["momentum_buffer"], sb["state"][k]["momentum_buffer"]) for k in sa["state"])


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for v in range(5):
        checkpoint.save(tmp_path, {"phi": torch.zeros(3)}, {"version": v, "round": v})
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert len(names) == checkpoint.KEEP and checkpoint.latest(tmp_path).name == names[-1]
    assert not list(tmp_path.glob(".*.tmp"))


def test_corrupt_or_mismatched_checkpoints_are_clear_errors(tmp_path):
    path = checkpoint.save(tmp_path, {"phi": torch.ones(4)}, {"version": 1, "round": 1})
    blob = bytearray((path / "state.safetensors").read_bytes())
    blob[-1] ^= 0x01
    (path / "state.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        checkpoint.load(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        checkpoint.load(path)
    other = checkpoint.save(tmp_path / "o", {"outer.phi": torch.ones(4), "outer.m": torch.ones(4)},
                            {"version": 1, "round": 1, "model": "0" * 16, "states": {}})
    with pytest.raises(CheckpointError, match="holds 4 parameters"):
        checkpoint.restore(island(), {}, checkpoint.load(other), other, "0" * 16)
    with pytest.raises(CheckpointError, match="another model"):
        checkpoint.restore(island(), {}, checkpoint.load(other), other, "1" * 16)


def test_non_finite_values_are_never_written_nor_read(tmp_path):
    good = checkpoint.save(tmp_path, {"phi": torch.ones(2)}, {"version": 1, "round": 1})
    with pytest.raises(CheckpointError, match="non-finite values in phi"):
        checkpoint.save(tmp_path, {"phi": torch.tensor([1.0, float("nan")])}, {"version": 2, "round": 2})
    assert checkpoint.latest(tmp_path) == good and not list(tmp_path.glob(".*.tmp"))  # the last good one stays
    import safetensors.torch  # a file written by something else is still checked when read
    safetensors.torch.save_file({"phi": torch.tensor([1.0, float("inf")])}, good / "state.safetensors")
    meta = json.loads((good / "meta.json").read_text())
    meta["sha256"] = checkpoint._sha256(good / "state.safetensors")
    (good / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="non-finite"):
        checkpoint.load(good)


def test_latest_pointing_nowhere_is_an_error(tmp_path):
    checkpoint.save(tmp_path, {"phi": torch.zeros(1)}, {"version": 1, "round": 1})
    (tmp_path / "latest").write_text("ckpt-gone")
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.latest(tmp_path)
