"""`p2p-diloco bench discovery` end to end with a few members: the code path of the figures at size."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["dht", "zmq"])
def test_bench_discovery_measures_every_member_and_the_bootstrap_node(procs, tmp_path, kind):
    proc = procs.python("-m", "p2p_diloco", "bench", "discovery", "--members", "3", "--kind", kind, "--deadline", "60",
                        "--workdir", str(tmp_path), "--json", stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0
    out = json.loads(stdout.strip().splitlines()[-1])
    assert (out["members"], out["kind"], out["saw_all"], out["died"]) == (3, kind, 3, 0), out
    assert out["seen_at_end"] == [3, 3, 3] and 0 < out["slowest_start_s"] <= out["all_saw_all_s"] < 60, out
    assert len(out["memory_bytes"]) == 3 and min(out["memory_bytes"]) > 10 * 2**20, out  # a Python process at least
    assert out["bootstrap"]["peers_joined"] >= 3 and out["bootstrap"]["cpu_s"] > 0, out
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(tmp_path).encode() in _read(p)]
    assert not left, left  # the bootstrap node (its identity file is under tmp_path) is gone


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile
        return b""
