"""`examples/own_loop.py` end to end: a user's own model and loop, joined with `p2p_diloco.join`, learn and mix."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_loop.py"


def test_own_loop_example_learns_and_mixes(procs, tmp_path):
    # 10 s of training: ~15 rounds of H=20 per island on an idle 2-core machine, 5 or more under load
    proc = procs.spawn([sys.executable, str(EXAMPLE), "--json", "--seconds", "10", "--workdir", str(tmp_path)],
                       stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0
    out = json.loads(stdout)  # the whole of stdout is one JSON object
    assert len(out["islands"]) == 2, out
    for island in out["islands"]:
        assert math.isfinite(island["loss_start"]) and math.isfinite(island["loss_end"]), island
        assert island["loss_end"] < island["loss_start"] - 1.0, island  # 5.71 at the start, ~1.8 after 10 s
        assert island["mixes"] >= 1, island
    # every island measured the same held-out batch from the same initial weights
    assert out["islands"][0]["loss_start"] == out["islands"][1]["loss_start"], out
