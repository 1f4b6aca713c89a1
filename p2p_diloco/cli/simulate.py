"""`p2p-diloco simulate`: K islands in one process on a virtual clock, methods compared at equal tokens."""

from __future__ import annotations

import os

import click

from p2p_diloco.cli.options import (
    build_configs, codec_option, csv, device_options, diloco_options, gossip_tuning_options, model_options,
    model_shape_options, offload_option, outer_step_options, retired_option, user_errors
)
from p2p_diloco.config import DiLoCoConfig
from p2p_diloco.sim.config import SIM_METHODS, SimConfig

S = SimConfig


@click.command()
@model_options
@model_shape_options
@diloco_options()
@outer_step_options
@gossip_tuning_options
@device_options
@offload_option
@click.option("--islands", "-k", type=int, default=S.islands, show_default=True, help="K: number of islands.")
@click.option("--method", "methods", default=",".join(S.methods), show_default=True, callback=csv(str),
              help=f"Comma list of {', '.join(SIM_METHODS)}: gossip DiLoCo, synchronous DiLoCo, data parallel.")
@click.option("--tokens", type=int, default=S.tokens, show_default=True, help="Total training tokens per method.")
@click.option("--time-budget", type=float, default=S.time_budget, help="Virtual seconds; stop every method when spent.")
@click.option("--speeds", default=S.speeds, callback=csv(float), help="Per-island relative speed, e.g. 1,1,1,0.1.")
@click.option("--drop-prob", type=float, default=S.drop_prob, show_default=True, help="Chance an island misses a round.")
@click.option("--latency-ms", type=float, default=S.latency_ms, show_default=True, help="Simulated one-way link latency.")
@click.option("--bandwidth-mbps", default=str(S.bandwidth_mbps), show_default=True, callback=csv(float),
              help="Download rate of every island's link, Mbit/s, or a comma list of one per island (1000,1000,20,0.5).")
@click.option("--upload-mbps", default=None, callback=csv(float),
              help="Upload rate, Mbit/s, for all or one per island (default: as the download; home links upload slower).")
@codec_option(S.compression)
@retired_option("--partners", "the exchange picks partners: drawn for whole states, the ring for --exchange updates")
@retired_option("--update-k", "updates travel in sign or int4, which keep every value")
@retired_option("--update-mixing", "a receiver moves by the difference of the public states")
@click.option("--update-keep", type=int, default=S.update_keep, show_default=True,
              help="Updates a sender keeps for receivers behind (0: as many as the fp32 public state's bytes).")
@click.option("--fragments", type=int, default=DiLoCoConfig.fragments, show_default=True,
              help="With --exchange fragments: each update covers one of this many spans of the parameters.")
@click.option("--mix-delay", type=click.IntRange(0, 1), default=S.mix_delay, show_default=True,
              help="Rounds between a partner's state being published and mixed.")
@click.option("--step-seconds", type=float, default=S.step_seconds, show_default=True,
              help="Virtual seconds of one inner step (the tiny model's on the reference machine, BENCHMARKS.md); "
                   "with the link it sets how far into a round a partner's state arrives.")
@click.option("--seed", type=int, default=S.seed, show_default=True, help="Seed of weights, data order and faults.")
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=None,
              help="Methods run at once, each in its own process with one thread (default: the number of cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def simulate(**kw) -> None:
    """Simulate K islands in one process on a virtual clock and compare methods at equal tokens."""
    import torch

    from p2p_diloco.core.device import autocast, resolve_device
    from p2p_diloco.sim.report import run_simulation

    with user_errors():
        as_json, data, jobs = kw.pop("as_json"), kw.pop("data"), kw.pop("jobs") or os.cpu_count() or 1
        vocab_size = kw.pop("vocab_size")
        if jobs == 1:
            torch.set_num_threads(max(1, torch.get_num_threads()))
        model, train, diloco = build_configs(kw)
        # an unusable device or precision fails here, in one line, before any method runs
        autocast(resolve_device(train.device), train.precision)
        sim = SimConfig(islands=kw["islands"], methods=tuple(kw["methods"]), tokens=kw["tokens"],
                        time_budget=kw["time_budget"], speeds=kw["speeds"], drop_prob=kw["drop_prob"],
                        latency_ms=kw["latency_ms"], bandwidth_mbps=kw["bandwidth_mbps"],
                        upload_mbps=kw["upload_mbps"], compression=kw["compression"],
                        mix_delay=kw["mix_delay"], step_seconds=kw["step_seconds"], seed=kw["seed"],
                        update_keep=kw["update_keep"])
        run_simulation(sim, model, train, diloco, data, as_json, jobs, vocab_size=vocab_size)

