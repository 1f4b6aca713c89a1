"""examples/hf_gpt2.py: a Hugging Face GPT-2 from its config on token shards, one torchrun island of
2 processes with the model sharded by FSDP2, through `p2p_diloco.join`; its loss falls over 2 rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_gpt2.py"


def test_the_example_trains_a_sharded_hf_gpt2(tmp_path):
    pytest.importorskip("transformers")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--fsdp",
                          "--max-rounds", "2", "--local-steps", "5", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=110, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["fsdp"] and s["world"] == 2 and s["rounds"] == 2 and s["version"] == 2, s
    assert s["tokens"] == 2 * 5 * 2 * 8 * 128, s  # rounds x H x ranks x batch x context
    assert s["eval_loss"] < s["initial_loss"] - 1.0, s  # from ln 256 = 5.55 towards what bytes of Python allow
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [*(f"train_{i:02d}.bin" for i in range(4)), "val.bin"]
