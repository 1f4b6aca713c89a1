"""Discovery over the hivemind DHT with real processes on 127.0.0.1."""

from __future__ import annotations

import pytest
from discovery_harness import run_swarm


@pytest.mark.timeout(240)
def test_swarm_of_eight_over_dht(procs, tmp_path):
    figures = run_swarm(procs, tmp_path, "dht")
    print("dht figures:", figures)
    assert figures["join_all_s"] <= 10.0
    assert figures["clean_exit_s"] <= 2.0
    assert figures["sigkill_s"] <= 6.0 + 0.5
