"""`bench churn`'s parts: who is killed when, the load each island served, partial mixes, and the
processes an island's session still holds (`bench.churn`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2p_diloco.bench.churn import Life, Schedule, SwarmRun, figures, partial_mixes, session_processes

pytestmark = pytest.mark.timeout(60)


def test_the_schedule_kills_a_quarter_of_the_islands_that_start_and_keeps_the_late_ones_apart():
    names = [f"island-{i}" for i in range(16)]
    s = Schedule.draw(names, rounds_each=8, kills=4, late=2, seed=0)
    assert s.late == ("island-14", "island-15") and s.late_at == 2
    assert len(s.kills) == 4 and not set(s.kills) & set(s.late)
    assert all(1 <= after <= 6 and 0 <= share < 1 for after, share in s.kills.values())
    assert Schedule.draw(names, 8, 4, 2, seed=0) == s and Schedule.draw(names, 8, 4, 2, seed=1) != s


def test_a_whole_state_that_moved_fewer_bytes_than_the_others_is_a_partial_mix():
    whole = [{"weight": 0.5, "fetched": "state", "bytes_in": 1_284_970 - k * 300} for k in range(5)]  # headers vary
    rows = whole + [{"weight": 0.0, "fetched": "state", "bytes_in": 10}, {"weight": 0.4, "fetched": "updates", "bytes_in": 50}]
    assert partial_mixes(rows) == 0  # refused states and updates are not whole states mixed
    assert partial_mixes(rows + [{"weight": 0.5, "fetched": "state", "bytes_in": 1_284_970 - 2 * 65_536}]) == 1  # a chunk short
    assert partial_mixes([]) == 0


def test_a_process_left_in_an_islands_session_is_found_until_it_ends():
    # a child that outlives its parent in the parent's session, as a DHT process left by a killed island would
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)']); print(p.pid, flush=True)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(parent.stdout.readline())
    parent.wait(timeout=30)
    try:
        left = session_processes({parent.pid})
        assert [line.split()[0] for line in left] == [str(child)] and "time.sleep(60)" in left[0]
    finally:
        subprocess.run(["kill", "-9", str(child)])
    for _ in range(100):
        if not session_processes({parent.pid}):
            break
        time.sleep(0.05)
    assert session_processes({parent.pid}) == []


def test_figures_count_what_each_island_served_per_round_under_every_peer_id_it_had(tmp_path: Path):
    names = ["island-0", "island-1", "island-2"]
    state = {"fetched": "state", "bytes_in": 1_000_000}
    rows = {"island-0": [{"round": 1, "partner": "b1", "weight": 0.5, **state}, {"round": 2, "partner": "c", "weight": 0.5, **state}],
            "island-1": [{"round": 1, "partner": "a", "weight": 0.5, **state}, {"round": 2, "partner": "c", "weight": 0.0, **state,
                                                                                  "refused": "far"}],
            "island-2": [{"round": 1, "partner": "b2", "weight": 0.5, **state}, {"round": 2, "partner": "a", "weight": 0.5, **state}]}
    for name, mine in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
    run = SwarmRun(tmp_path, names, [], ())
    # island-1 was killed and resumed under another peer id: what both of its lives served counts
    run.lives = [Life("island-0", None, 0.0, "a"), Life("island-1", None, 0.0, "b1", killed_at=1.0, rows_at_kill=1),
                 Life("island-2", None, 0.0, "c"), Life("island-1", None, 2.0, "b2")]
    out = figures(run)
    assert out["served_per_round"] == {"island-0": 1.0, "island-1": 1.0, "island-2": 1.0}
    assert out["most_served_to_mean"] == 1.0 and out["partial_mixes"] == 0 and out["refused"] == 1
    assert out["mixes_per_round"] == round(5 / 6, 3) and out["rounds"] == {n: 2 for n in names}
