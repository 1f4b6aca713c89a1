"""A 124M-parameter island really runs on CPU: two of them, a few inner steps, rounds, mixes.

Nothing in the exchange may assume a tiny state (message limits, chunk sizes, timeouts, memory):
two GPT-2-small islands (124M parameters each) train three short rounds through the public API
and each mixes the other's 124M-value state.
"""

import json
import sys
from pathlib import Path

import pytest
from swarm_harness import start_bootstrap

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
SCRIPT = Path(__file__).with_name("big_island.py")


def test_two_124m_islands_train_and_mix(procs, tmp_path):
    _, bootstrap = start_bootstrap(procs, tmp_path)
    outs = {}
    for name in ("big-a", "big-b"):
        outs[name] = tmp_path / f"{name}.json"
        procs.spawn([sys.executable, str(SCRIPT), str(tmp_path / name), bootstrap[0], name],
                    stdout=open(outs[name], "w"), stderr=open(tmp_path / f"{name}.log", "w"))
    for p in procs.procs[-2:]:
        assert p.wait(280) == 0, (tmp_path / "big-a.log").read_text()[-3000:] + (tmp_path / "big-b.log").read_text()[-3000:]
    for name, out in outs.items():
        s = json.loads(out.read_text().splitlines()[-1])
        assert 124_000_000 < s["params"] < 125_000_000
        assert s["rounds"] == 3 and s["version"] >= 3
        assert s["mixes"] >= 1, f"{name} mixed no partner state: {s}"
        # at least one whole int8 state (125 MB) came in
        assert s["bytes_in"] > 100_000_000, f"{name}: {s}\n" + (tmp_path / f"{name}.log").read_text()[-3000:]
