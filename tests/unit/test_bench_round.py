"""`bench round` at a small size: the row's keys, types and arithmetic, the model-size rule, the CLI's parsing."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from p2p_diloco.bench.memory import PeakMeter
from p2p_diloco.bench.round import model_shape, run_round, shape_params
from p2p_diloco.cli import main

KEYS = {"exchange": str, "device": str, "params": int, "state_bytes": int, "clone_s": float, "snapshot_s": float,
        "publish_s": float, "fetch_s": float, "measure_s": float, "mix_s": float, "outer_s": float, "overhead_s": float, "blocked_s": float,
        "background_s": float, "snapshot_copies": int, "peak_extra_bytes": int, "overhead_per_param_ns": float,
        "overhead_vs_clone": float, "peak_extra_vs_state": float, "probe_s": float, "step_s": float,
        "probe_vs_step": float}


@pytest.mark.timeout(60)
def test_one_small_size_gives_a_consistent_row():
    out = run_round([200_000])
    (row,) = out["rows"]
    assert set(row) - {"peak_method"} == set(KEYS)
    for key, kind in KEYS.items():
        assert type(row[key]) is kind, key
        assert key in ("exchange", "device") or row[key] > 0, key
    assert row["exchange"] == "state" and row["device"] == "cpu" and "device_peak_extra_bytes" not in row
    assert row["params"] == shape_params(model_shape(200_000))
    assert row["state_bytes"] == 4 * row["params"]
    assert row["overhead_s"] == pytest.approx(row["snapshot_s"] + row["publish_s"] + row["fetch_s"] + row["measure_s"]
                                              + row["mix_s"] + row["outer_s"])
    # the training thread's share of a round's end, and the other threads' work
    assert row["blocked_s"] == pytest.approx(row["snapshot_s"] + row["outer_s"])
    assert row["background_s"] == pytest.approx(row["publish_s"] + row["fetch_s"] + row["measure_s"])
    assert row["snapshot_copies"] == 2  # the anchor, and the momentum that travels (int4, encoded later)
    assert row["overhead_per_param_ns"] == pytest.approx(row["overhead_s"] / row["params"] * 1e9)
    assert row["overhead_vs_clone"] == pytest.approx(row["overhead_s"] / row["clone_s"])
    assert row["peak_extra_vs_state"] == pytest.approx(row["peak_extra_bytes"] / row["state_bytes"])
    assert row["probe_vs_step"] == pytest.approx(row["probe_s"] / row["step_s"])
    # the island adds at least its anchor and momentum (2 x state) to what it held before the round
    assert row["peak_extra_bytes"] >= 2 * row["state_bytes"]


def test_model_sizes_follow_gpt2_and_are_counted_exactly():
    from p2p_diloco.core.model import GPT

    assert model_shape(124_000_000) == {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024,
                                        "vocab_size": 50257}
    assert shape_params(model_shape(124_000_000)) == 124_356_864  # GPT-2 small with a tied head
    for n in (100_000, 1_000_000):
        shape = model_shape(n)
        assert GPT(**shape).num_params() == shape_params(shape)
        assert 0.7 < shape_params(shape) / n < 1.3


@pytest.mark.parametrize("clear_refs", [True, False], ids=["clear_refs", "sampled"])
def test_peak_meter_sees_a_freed_allocation(monkeypatch, clear_refs):
    """Both ways of reading the peak see 64 MiB that were touched and freed before `take`."""
    import torch

    if not clear_refs:
        monkeypatch.setattr(PeakMeter, "_clear_refs", staticmethod(lambda: False))
    meter = PeakMeter()
    try:
        assert meter.method == ("clear_refs" if clear_refs else "sampled")
        x = torch.ones(16 * 2**20)
        time.sleep(0.02)  # a few samples while it is held
        del x
        assert meter.take() >= 60 * 2**20
        assert meter.take() < 16 * 2**20  # a new window starts at the RSS after the free
    finally:
        meter.close()


def test_params_accepts_floats_and_refuses_nonsense():
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "round", "--params", "1e6,abc"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output
    assert runner.invoke(main, ["bench", "round", "--params", "1.5"]).exit_code == 2  # not a model size
    assert runner.invoke(main, ["bench", "round", "--exchange", "state,bogus"]).exit_code == 2


def test_targets_are_judged_per_exchange_at_its_largest_size():
    from p2p_diloco.bench.round import PUBLIC_STATE_PEAK, TARGET_PEAK_VS_STATE, targets

    def row(exchange, params, peak):
        return {"exchange": exchange, "params": params, "overhead_vs_clone": 5.0, "peak_extra_vs_state": peak,
                "overhead_per_param_ns": 1.0, "outer_s": 1.0, "clone_s": 0.5, "snapshot_copies": 2,
                "blocked_s": 2.0 if exchange == "state" else 2.5}

    judged = targets([row("state", 10, 9.0), row("state", 100, 4.5), row("auto", 10, 1.0), row("auto", 100, 7.75),
                      row("updates", 100, 6.0)])
    peaks = {what: (limit, met) for what, _, limit, met in judged if what.startswith("peak")}
    snapshot = TARGET_PEAK_VS_STATE + 2  # (the publisher's snapshot of anchor and momentum, on the host)
    public = snapshot + PUBLIC_STATE_PEAK  # (an exchange that keeps a public state holds it too)
    assert peaks == {"peak_extra_bytes / state_bytes at 0.0M, state": (snapshot, True),
                     "peak_extra_bytes / state_bytes at 0.0M, auto": (public, False),
                     "peak_extra_bytes / state_bytes at 0.0M, updates": (public, True)}
    # the training thread's share of a round: the outer step and the snapshot's copies, at most
    blocked = {what.split(",")[1]: (limit, met) for what, _, limit, met in judged if what.startswith("blocked")}
    assert blocked == {" state": (2.0, True), " auto": (2.0, False), " updates": (2.0, False)}


@pytest.mark.timeout(60)
def test_an_exchange_with_a_public_state_is_measured_with_all_the_updates_it_keeps():
    from p2p_diloco.bench.round import measure
    from p2p_diloco.core.public import worth_keeping

    row = measure(200_000, repeat=1, exchange="updates")
    assert row["details"]["kept_updates"] == worth_keeping(row["params"], "sign")
    # anchor and momentum, the public state, and its kept updates (their bytes: up to the public state's)
    assert row["peak_extra_bytes"] >= 3.5 * row["state_bytes"], row["peak_extra_vs_state"]
