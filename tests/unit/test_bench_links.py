"""`bench links`' arithmetic on rows built here: windows, mixes, honest refusals, recovery, progress.

No namespace and no process: what the bench reads from `metrics.jsonl` is made up row by row.
"""

from __future__ import annotations

import pytest

from p2p_diloco.bench.links import (
    cut_off, figures, halves, mixes, progress, recovery, refusals, split, table
)

A, B, C = "peer-a", "peer-b", "peer-c"


def row(t: float, partner: str | None = None, weight: float | None = None, **more) -> dict:
    return {"time": t, "round": int(t), "partner": partner, "weight": weight, **more}


def test_rows_split_by_their_time_around_the_event():
    rows = [row(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)]
    parts = split(rows, 2.0, 4.0)
    assert [[r["time"] for r in parts[w]] for w in ("before", "during", "after")] == [[1.0], [2.0, 3.0], [4.0, 5.0]]
    assert [len(v) for v in split(rows, None, None).values()] == [5, 0, 0]  # the event never began
    assert [len(v) for v in split(rows, 3.5, None).values()] == [3, 2, 0]  # ... or never ended


def test_a_mix_is_a_weight_above_zero_pushed_ones_too():
    assert mixes(row(1, A, 0.5)) == 1
    assert mixes(row(1, A, 0.0)) == 0  # too stale: arrived, weighed nothing
    assert mixes(row(1)) == 0
    pushed = row(1, A, 0.5, pushed_in=[{"partner": B, "weight": 0.3}, {"partner": C, "weight": 0.0}])
    assert mixes(pushed) == 2
    assert mixes(pushed, {B}) == 1 and mixes(pushed, {A, B}) == 2 and mixes(pushed, {C}) == 0


def test_refusals_count_only_the_runs_islands_wherever_the_row_names_them():
    r = row(1, A, None, refused="implausible", refused_from=[B, "stranger"],
            pushed_in=[{"partner": C, "weight": 0.0, "refused": "non-finite"}])
    assert refusals(r, {A, B, C}) == 3
    assert refusals(r, {B}) == 1
    assert refusals(row(1, A, 0.5), {A}) == 0


def test_recovery_is_the_rounds_until_the_first_mix_after_the_event():
    after = [row(5), row(6, A, 0.0), row(7, B, 0.4), row(8, A, 0.5)]
    assert recovery(after) == 3
    assert recovery(after, {A}) == 4
    assert recovery(after, {C}) is None
    assert recovery([]) is None


def test_figures_of_an_island_cut_off_mid_run():
    rows = [row(1, B, 0.5), row(2, C, 0.5),  # before
            row(3, refused_from=[B]), row(4, C, 0.5),  # during: B unreachable, C still mixed
            row(5), row(6, B, 0.5)]  # after
    f = figures(rows, 2.5, 4.5, {A, B, C}, {B})
    assert f["rounds"] == {"before": 2, "during": 2, "after": 2}
    assert f["mixes"] == {"before": 2, "during": 1, "after": 1}
    assert f["mixes_per_round"] == {"before": 1.0, "during": 0.5, "after": 0.5}
    assert f["cross_mixes"] == {"before": 1, "during": 0, "after": 1}
    assert f["honest_refusals"] == {"before": 0, "during": 1, "after": 0}
    assert f["recovery_rounds"] == 2 and f["cross_recovery_rounds"] == 2
    plain = figures(rows, None, None, {A, B, C}, None)  # no event, nothing cut
    assert plain["cross_mixes"] is None and plain["recovery_rounds"] is None
    assert plain["mixes_per_round"]["during"] is None


def test_who_the_events_cut_apart():
    assert halves(4) == ([0, 1], [2, 3]) and halves(3) == ([0], [1, 2])
    assert cut_off("drop", 3, 4) == [0, 1, 2] and cut_off("drop", 0, 4) == [3]
    assert cut_off("partition", 1, 4) == [2, 3] and cut_off("partition", 2, 4) == [0, 1]
    assert cut_off("fast", 0, 4) == [] and cut_off("slow-uplink", 3, 4) == []


def test_progress_is_the_mean_share_of_the_budget_carried_on_between_rows():
    island = [{"time": 100.0, "own_tokens": 1000, "wall_s": 10.0}]  # 100 tokens/s
    assert progress([island, []], 4000, 1000, 100.0) == pytest.approx(0.125)
    assert progress([island], 4000, 1000, 105.0) == pytest.approx(1500 / 4000)
    assert progress([island], 4000, 1000, 200.0) == pytest.approx(2000 / 4000)  # at most one round further
    assert progress([island], 1200, 1000, 200.0) == pytest.approx(1.0)  # never past the budget
    assert progress([], 4000, 1000, 0.0) == 0.0


def test_the_table_has_a_line_per_island_and_per_scenario():
    island = {"name": "island-0", "affected": True, "eval_loss": 2.5, **figures([row(1, B, 0.5)], 0.5, 2.0, {B}, {B})}
    out = {"islands": 1, "tokens_per_island": 10, "runs": 1, "fast_rate": "1000mbit", "latency_ms": 100.0,
           "affected_island": "island-0", "partition": [[], ["island-0"]],
           "scenarios": {"drop": {"runs": [{"islands": [island]}], "mean_eval_loss": 2.5,
                                  "mixes_per_round": {"before": None, "during": 1.0, "after": None},
                                  "honest_refusals": 0, "recovery_rounds_max": None, "timed_out": 0}}}
    lines = table(out)
    assert len(lines) == 4 and "island-0*" in lines[2] and "-/1.00/-" in lines[2] and "0/1/0" in lines[2]
