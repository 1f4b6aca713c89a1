"""The simulator on a very small model: reproducibility, symmetry, budgets and the CLI's JSON."""

import json

import pytest
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.sim.config import SimConfig
from p2p_diloco.core.data import load_corpus
from p2p_diloco.errors import ConfigError
from p2p_diloco.sim.simulator import Simulation

SMALL = ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32)
TRAIN = TrainConfig(batch_size=4, warmup_steps=2)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=3_000_000)


def run(corpus, method, diloco=None, **sim):
    sim = SimConfig(**{"tokens": 4 * 4 * 32 * 20, "eval_batches": 2, **sim})
    return Simulation(sim, SMALL, TRAIN, diloco or DiLoCoConfig(local_steps=5), corpus).run(method)


def test_same_seed_same_numbers(corpus):
    a, b = run(corpus, "gossip", seed=3), run(corpus, "gossip", seed=3)
    assert a.as_dict() == b.as_dict()
    c = run(corpus, "gossip", seed=4)
    assert c.eval_loss != a.eval_loss


@pytest.mark.parametrize("method", ["gossip", "allreduce", "dp"])
def test_every_method_spends_exactly_the_token_budget(corpus, method):
    r = run(corpus, method)
    assert r.tokens == 4 * 4 * 32 * 20
    assert r.eval_loss < 5.6  # below the uniform-byte loss ln(256) = 5.55 plus init noise


def test_allreduce_islands_stay_identical(corpus):
    r = run(corpus, "allreduce")
    assert r.eval_loss == r.eval_loss_worst == r.eval_loss_consensus


def test_two_islands_fresh_symmetric_mixing_end_identical(corpus):
    d = DiLoCoConfig(local_steps=5, exchange="state")  # (a public state is simulated with mix_delay 1 only)
    r = run(corpus, "gossip", d, islands=2, mix_delay=0, compression="fp32")
    assert r.per_island[0] == r.per_island[1]


def test_straggler_does_not_slow_gossip(corpus):
    budget = 30 * SimConfig.step_seconds  # 30 steps of a speed-1 island: 3 of the slow one, not a whole round
    r = run(corpus, "gossip", speeds=(1, 1, 1, 0.1), time_budget=budget)
    ar = run(corpus, "allreduce", speeds=(1, 1, 1, 0.1), time_budget=budget)
    assert r.utilization > 0.95
    assert ar.utilization < 0.5
    assert r.tokens > 2 * ar.tokens


def test_bytes_counted_with_the_codec(corpus):
    """The anchor travels in the codec; the default momentum in int4 (half of int8) whatever it is."""
    local = DiLoCoConfig(local_steps=5, momentum="local")
    fp32, int8 = (run(corpus, "gossip", local, compression=c).bytes_sent_per_island for c in ("fp32", "int8"))
    assert 3.8 < fp32 / int8 < 4.0
    fp32_m, int8_m = (run(corpus, "gossip", compression=c).bytes_sent_per_island for c in ("fp32", "int8"))
    assert 2.9 < fp32_m / int8_m < 3.0 and 1.49 < int8_m / int8 < 1.52


def test_bad_sim_config():
    with pytest.raises(ConfigError, match="simulate.speeds"):
        SimConfig(islands=4, speeds=(1, 1))
    with pytest.raises(ConfigError, match="simulate.drop_prob"):
        SimConfig(drop_prob=1.5)


def test_cli_json_shape():
    args = ["simulate", "--json", "--tokens", "8192", "-H", "4", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
            "--block-size", "32", "--batch-size", "4", "--method", "gossip,dp"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["methods"]) == {"gossip", "dp"}
    keys = {"eval_loss", "eval_loss_worst", "eval_loss_consensus", "tokens", "bytes_sent_per_island", "virtual_seconds",
            "utilization", "mixes_per_round", "fetches"}  # (`fetches`: what `--exchange auto`, the default, fetched)
    assert set(out["methods"]["gossip"]) == keys and out["methods"]["dp"]["mixes_per_round"] is None
    assert out["methods"]["gossip"]["fetches"]["updates"] == 4  # (1 Gbit/s: whole states after the first contacts)
    assert 0 < out["methods"]["gossip"]["mixes_per_round"] <= 1
    assert out["config"]["sim"]["islands"] == 4
    assert out["config"]["sim"]["step_seconds"] == SimConfig.step_seconds


def test_step_seconds_sets_where_in_a_round_a_partner_state_arrives(corpus):
    """A 0.2 s fetch lands after the first of 5 steps of 0.35 s, only at the round end with 0.05 s steps."""
    arrival = DiLoCoConfig(local_steps=5, final_mix=False)
    slow, fast = run(corpus, "gossip", arrival, step_seconds=0.35), run(corpus, "gossip", arrival, step_seconds=0.05)
    # mixed after the first step, the partner's state trains on with the island: a lower loss (by 0.0012 at
    # seed 0; 0.0025-0.008 at seeds 1-3)
    assert slow.eval_loss < fast.eval_loss - 5e-4, (slow.eval_loss, fast.eval_loss)
    # 4 rounds of 5 steps each; the fetch (0.2 s) never holds a round up, not even one of 5 x 0.05 s
    assert (slow.virtual_seconds, fast.virtual_seconds) == pytest.approx((4 * 5 * 0.35, 4 * 5 * 0.05))
    res = CliRunner().invoke(main, ["simulate", "--step-seconds", "0", "--tokens", "100"])
    assert res.exit_code != 0 and "simulate.step_seconds" in res.output


def test_final_mix_costs_one_fetch_per_island(corpus):
    with_final, without = (run(corpus, "gossip", DiLoCoConfig(local_steps=5, final_mix=f, exchange="state"))
                           for f in (True, False))
    assert with_final.bytes_sent_per_island * 3 == without.bytes_sent_per_island * 4  # 3 fetches each, then a 4th
    assert with_final.tokens == without.tokens and with_final.eval_loss != without.eval_loss


def test_cli_bad_value_is_a_readable_error():
    res = CliRunner().invoke(main, ["simulate", "--speeds", "1,1", "--tokens", "100"])
    assert res.exit_code != 0 and "simulate.speeds" in res.output and "Traceback" not in res.output


def test_momentum_modes_count_their_bytes(corpus):
    """What travels per fetch: the anchor, plus the momentum in its mode's codec when it travels."""
    sent = {mode: run(corpus, "gossip", DiLoCoConfig(local_steps=5, momentum=mode)).bytes_sent_per_island
            for mode in ("local", "rescaled-int4", "rescaled-sign")}
    ratio = {mode: b / sent["local"] for mode, b in sent.items()}
    assert 1.49 < ratio["rescaled-int4"] < 1.52 and 1.1 < ratio["rescaled-sign"] < 1.16


@pytest.mark.parametrize("args, names", [
    (["--mix-at", "start"], "--mix-at"), (["--momentum", "noloco"], "rescaled-int4"),
    (["--partners", "ring"], "ring for --exchange updates"), (["--update-codec", "topk"], "sign or int4"),
    (["--mix-pseudo-gradient"], "--mix-pseudo-gradient")])
def test_a_removed_option_names_its_replacement(args, names):
    res = CliRunner().invoke(main, ["simulate", "--tokens", "100", *args])
    assert res.exit_code == 2 and "was removed" in res.output and names in res.output, res.output
    assert "Modes removed" in res.output and "Traceback" not in res.output


LONG = 4 * 4 * 32 * 100
"""Tokens for 20 rounds of 5 steps per island."""


def test_a_fetch_slower_than_a_round_lands_in_a_later_round_and_holds_nobody_up(corpus):
    """As in the swarm: one fetch at a time, never waited for, mixed in the round it lands in at its
    staleness then (SMALL's state is ~33 kB: ~1 s at 0.25 Mbit/s, 4 rounds of 5 x 0.05 s)."""
    d = DiLoCoConfig(local_steps=5, final_mix=False, exchange="state")
    fast = run(corpus, "gossip", d, step_seconds=0.05, tokens=LONG)
    slow = run(corpus, "gossip", d, step_seconds=0.05, bandwidth_mbps=0.25, tokens=LONG)
    assert fast.utilization == slow.utilization == 1.0
    assert fast.virtual_seconds == pytest.approx(slow.virtual_seconds)  # nobody waited for a fetch
    assert fast.mixes_per_round > 2 * slow.mixes_per_round > 0  # fewer fetches, and they land stale
    assert slow.bytes_sent_per_island < fast.bytes_sent_per_island / 2


def test_each_island_has_its_own_link_and_upload_apart_from_download(corpus):
    d, at = DiLoCoConfig(local_steps=5, final_mix=False), {"step_seconds": 0.05, "tokens": LONG}
    uniform = run(corpus, "gossip", d, bandwidth_mbps=0.25, **at)
    each = run(corpus, "gossip", d, bandwidth_mbps=(0.25, 0.25, 0.25, 0.25), **at)
    assert each.as_dict() == uniform.as_dict()
    slow_uploads = run(corpus, "gossip", d, bandwidth_mbps=1000.0, upload_mbps=0.25, **at)
    assert slow_uploads.as_dict() == uniform.as_dict()  # a fetch runs at the slower end
    one_slow = run(corpus, "gossip", d, bandwidth_mbps=(1000, 1000, 1000, 0.25), **at)
    assert uniform.mixes_per_round < one_slow.mixes_per_round < run(corpus, "gossip", d, **at).mixes_per_round
    with pytest.raises(ConfigError, match="simulate.bandwidth_mbps"):
        SimConfig(islands=4, bandwidth_mbps=(1, 1))
    with pytest.raises(ConfigError, match="simulate.upload_mbps"):
        SimConfig(upload_mbps=0.0)
    res = CliRunner().invoke(main, ["simulate", "--bandwidth-mbps", "1000,1000,20", "--tokens", "100"])
    assert res.exit_code != 0 and "simulate.bandwidth_mbps" in res.output


def test_the_final_mix_takes_only_a_fetch_that_lands_within_the_swarms_wait():
    from p2p_diloco.core.schedule import FINAL_MIX_WAIT_S, final_fetch_in_time

    assert final_fetch_in_time(FINAL_MIX_WAIT_S + 10.0, 10.0) and not final_fetch_in_time(FINAL_MIX_WAIT_S + 10.1, 10.0)


def test_auto_fetches_whole_states_on_a_fast_link_and_updates_on_a_slow_one(corpus):
    """`exchange="auto"`: the same choice as the swarm's islands (`core.linkfit`): whole states where
    one fits well within a round; where it would not, the first whole-state fetch gives way after its
    probe and every later fetch takes updates (SMALL's state is ~33 kB; rounds of 5 x 0.05 s). Each
    island's first fetch (its first contact) takes updates: on the fast link it measures nothing."""
    d, at = DiLoCoConfig(local_steps=5, exchange="auto", final_mix=False), {"step_seconds": 0.05, "tokens": LONG}
    fast, slow = run(corpus, "gossip", d, **at), run(corpus, "gossip", d, bandwidth_mbps=0.25, **at)
    assert fast.fetches["updates"] == 4 and fast.fetches["gave_way"] == fast.fetches["changes"] == 0
    assert fast.fetches["state"] > 10 * fast.fetches["updates"]
    # (SMALL's first-contact update moves in ~10 ms, under `FIRST_CONTACT_MIN_S`: it measures nothing, the probe does)
    assert slow.fetches["gave_way"] == slow.fetches["changes"] == 4 and slow.fetches["state"] == 0
    state = DiLoCoConfig(local_steps=5, final_mix=False, exchange="state")
    states = run(corpus, "gossip", state, bandwidth_mbps=0.25, **at)
    assert slow.fetches["updates"] > 10 and slow.mixes_per_round > 1.5 * states.mixes_per_round
    assert slow.bytes_sent_per_island < fast.bytes_sent_per_island / 4
