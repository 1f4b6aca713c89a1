"""Reads what an island's trackers wrote under its run directory (`peers/reports/trackers.py`): the
scalars of its TensorBoard event files and the records of its offline W&B run, with no service or
network. Shared by the unit test of the trackers and the end-to-end test of issue 47."""

from __future__ import annotations

import json
from pathlib import Path


def tensorboard_scalars(run_dir: Path) -> dict[str, list]:
    """Every scalar tag of `run_dir/tensorboard` -> its events (`.step`, `.value`), in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(run_dir) / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def wandb_records(run_dir: Path) -> list:
    """Every record of the offline W&B run under `run_dir` (its `.wandb` file: a header of 7 bytes, then
    records of 7-byte headers, crc32, length and kind, in blocks of 32 KiB; kinds 1 whole, 2-4 in parts)."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # (the rest of a block too short for a header is padding)
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def wandb_history(records: list) -> list[dict]:
    """The history rows (`run.log` calls) among `records`, each as {key: value}, `_step` included."""
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
