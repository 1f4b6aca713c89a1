"""`p2p-diloco join`: start an island (also as one rank of a torchrun group).

`--port P` (P != 0) fixes every port an island listens on, to open in a firewall: the state
exchange on P, the DHT on P+1 (or the config file's [discovery] port), the ZeroMQ peer exchange on
P+2 (`island_ports`). The settings a user rarely changes have no flag (`CONFIG_FILE_ONLY`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import click

from p2p_diloco.admission import AdmissionConfig
from p2p_diloco.cli.config_file import advanced_field, advanced_section, apply_advanced
from p2p_diloco.cli.options import (
    build_configs, config_file_option, device_options, diloco_options, discovery_config, discovery_options, grouped,
    model_options, retired_option, secret_options, swarm_secret, user_errors
)
from p2p_diloco.config import (
    DHT_PORT_OFFSET, PX_PORT_OFFSET, REACH_MODES, SHARDS, DiLoCoConfig, DiscoveryConfig, IslandConfig, NetworkConfig,
    TrainConfig
)
from p2p_diloco.errors import ConfigError
from p2p_diloco.tracking import TRACKERS, LogConfig, parse_trackers, require_trackers

I = IslandConfig
JOIN_GROUPS = {
    "The swarm": ("bootstrap", "run_id", "secret", "secret_file", "discovery", "host", "announce_host", "port",
                  "reach", "wait_for"),
    "Model and data": ("model_size", "data", "vocab_size", "batch_size", "lr", "device", "precision", "shard"),
    "Training": ("local_steps", "momentum", "exchange", "max_tokens", "max_rounds", "max_seconds",
                 "run_dir", "resume", "fresh"),
    "Output": ("name", "quiet", "as_json", "log_to", "help"),
}
"""How `join --help` lists its options."""

CONFIG_FILE_ONLY = (
    ("--n-layer", "model", None), ("--n-embd", "model", None), ("--n-head", "model", None),
    ("--block-size", "model", None), ("--seed", "train", None), ("--threads", "train", None),
    ("--outer-lr", "diloco", None), ("--outer-momentum", "diloco", None), ("--final-mix/--no-final-mix", "diloco", "final_mix"),
    ("--offload-outer/--no-offload-outer", "diloco", "offload_outer"), ("--round-seconds", "diloco", None),
    ("--mix-weight", "diloco", None), ("--max-staleness", "diloco", None), ("--same-version-wait", "island", None),
    ("--max-stretch", "island", None), ("--eval-every", "island", None), ("--checkpoint-every", "island", None),
    ("--compression", "network", None), ("--fetch-timeout", "network", "fetch_timeout_s"),
    ("--max-upload-mbps", "network", None), ("--dht-port", "discovery", "port"), ("--update-codec", "diloco", None),
    ("--join-timeout", "discovery", None), ("--wandb-project", "log", None))
"""Settings a user rarely changes, set in the config file only (flag, table, field): given as a flag,
each is a one-line usage error naming its table."""


def _config_file_only(f):
    for flag, section, field in CONFIG_FILE_ONLY:
        f = config_file_option(flag, section, field)(f)
    return f


def _trackers(_ctx, param, value) -> tuple[str, ...]:
    """click callback of `--log-to`: a comma-separated list (a config file's list too) of `TRACKERS`."""
    try:
        return parse_trackers(value)
    except ConfigError:
        raise click.BadParameter(f"{value!r}: expected a comma-separated list of {', '.join(TRACKERS)}",
                                 param=param) from None


@click.command(cls=grouped(JOIN_GROUPS))
@discovery_options()
@model_options
@diloco_options(update_codec=False)
@device_options
@click.option("--shard", type=click.Choice(SHARDS), default=TrainConfig.shard, show_default=True,
              help="Under torchrun: replicate the model on every rank (DDP) or shard it over them (fsdp: FSDP2, "
                   "rank 0 keeps a full copy for the swarm).")
@secret_options("Swarm secret; islands without it can neither fetch nor inject state, nor see or join the member list.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=str(I.run_dir), show_default=True,
              help="Folder for metrics.jsonl and checkpoints.")
@click.option("--max-tokens", type=int, default=I.max_tokens, help="Stop after this island trained this many tokens.")
@click.option("--max-rounds", type=int, default=I.max_rounds, help="Stop after this many rounds.")
@click.option("--max-seconds", type=float, default=I.max_seconds, help="Stop after this many seconds of training.")
@click.option("--resume", is_flag=True, default=I.resume, help="Continue from the last checkpoint in --run-dir.")
@click.option("--fresh", is_flag=True, default=I.fresh,
              help="Start afresh in a --run-dir that holds an earlier run's checkpoints, moving them aside into "
                   "RUN_DIR/previous-<time>/ (a run directory with checkpoints needs this flag or --resume).")
@click.option("--wait-for", type=click.IntRange(min=1), default=I.wait_for, show_default=True,
              help=f"Before the first round, wait (up to {I.join_timeout_s:g} s) until this many islands, this one "
                   "included, are in the run.")
@click.option("--host", default=DiscoveryConfig.host, show_default=True, help="Address the state exchange, DHT and peer exchange listen on.")
@click.option("--announce", "announce_host", default=DiscoveryConfig.announce_host,
              help="Address others should dial (when --host is not reachable as such).")
@click.option("--port", type=click.IntRange(0, 65535 - PX_PORT_OFFSET), default=I.port, show_default=True,
              help=f"State exchange port; the DHT takes PORT+{DHT_PORT_OFFSET} (or [discovery] port) and the ZeroMQ "
                   f"peer exchange PORT+{PX_PORT_OFFSET}: open these in a firewall (0: any free ports).")
@click.option("--reach", type=click.Choice(REACH_MODES), default=I.reach, show_default=True,
              help="auto: at start the bootstrap node dials this island to learn whether others can reach it; "
                   "direct: assume they can; outbound: they cannot, so nobody dials this island; it fetches from "
                   "reachable islands and pushes its state to them.")
@click.option("--name", default=I.name,
              help="This island's name in logs, progress lines, `status` and the dashboard (at most 32 printable "
                   "ASCII characters; default: its peer id's first 8).")
@click.option("--quiet", is_flag=True, default=I.quiet, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the island's summary as JSON at exit.")
@click.option("--log-to", type=click.UNPROCESSED, default=LogConfig.to, metavar="TRACKERS", callback=_trackers,
              help="Also send each round's figures to these trackers, comma-separated: tensorboard (event files in "
                   "RUN_DIR/tensorboard), wandb (a W&B run, offline unless WANDB_MODE says otherwise). Each is an "
                   "extra: pip install 'p2p-diloco[tensorboard,wandb]'.")
@_config_file_only
@retired_option("--slowdown", "fault injection lives in `p2p-diloco bench member --slowdown`", figures=False)
@retired_option("--poison", "fault injection lives in `p2p-diloco bench member --poison`", figures=False)
@retired_option("--latency-ms", "link emulation lives in `p2p-diloco bench member --latency-ms`", figures=False, type=float)
@retired_option("--bandwidth-mbps", "link emulation lives in `p2p-diloco bench member --bandwidth-mbps`", figures=False,
                type=float)
def join(**kw) -> None:
    """Start an island: find the swarm, train rounds, gossip with partners, checkpoint.

    The settings a user rarely changes (the model's shape, the seed, the outer step, evaluation and
    checkpoint intervals, the codecs, the join timeout, the W&B project) are set in a config file:
    `p2p-diloco --config FILE join ...` with [model], [train], [diloco], [island], [network],
    [discovery] and [log] tables (README, "A swarm across machines")."""
    run_join(kw)


def run_join(kw: dict, **faults) -> None:
    """The body of `join` (and of `bench member`, which passes `faults` on to `run_island`)."""
    with user_errors():
        # one swarm secret seals discovery records and keys the state exchange (docs/SECURITY.md)
        discovery = discovery_config(kw.pop("bootstrap"), kw.pop("run_id"), kw.pop("discovery"),
                                     host=kw["host"], announce_host=kw["announce_host"], secret=swarm_secret(kw),
                                     outbound_only=kw["reach"] == "outbound")
        data, vocab_size, as_json = kw.pop("data"), kw.pop("vocab_size"), kw.pop("as_json")
        model, train, diloco = build_configs(kw)
        island = IslandConfig(run_dir=Path(kw["run_dir"]), port=kw["port"], reach=kw["reach"], max_tokens=kw["max_tokens"],
                              max_rounds=kw["max_rounds"], max_seconds=kw["max_seconds"], resume=kw["resume"],
                              fresh=kw["fresh"], name=kw["name"], quiet=kw["quiet"], wait_for=kw["wait_for"])
        c = apply_advanced({"island": island, "model": model, "train": train, "diloco": diloco,
                            "network": NetworkConfig(), "discovery": discovery})
        log = apply_advanced({"log": LogConfig(to=kw["log_to"])})["log"]
        before_start(c["island"], log)
        import torch  # (after the checks above, which fail at once)

        from p2p_diloco.core.device import autocast, resolve_device
        from p2p_diloco.peers.launch.process import run_island
        from p2p_diloco.peers.parts import IslandParts

        port, dht_port, px_port = island_ports(c["island"].port, advanced_field("discovery", "port"))
        discovery = dataclasses.replace(c["discovery"], port=dht_port, px_port=px_port)
        train = c["train"]
        torch.set_num_threads(train.threads)
        # an unusable device or precision fails here, in one line, before the swarm starts
        autocast(resolve_device(train.device), train.precision)
        if advanced_field("train", "total_steps") is None:
            train = _schedule_length(train, c["model"].resolved()["block_size"], c["diloco"], c["island"])
        parts = dataclasses.replace(faults.pop("parts", IslandParts()),
                                    admission=AdmissionConfig.from_table(advanced_section("admission")), log=log)
        code, summary = run_island(c["island"], c["model"], train, c["diloco"], c["network"], discovery, data,
                                   vocab_size=vocab_size, parts=parts, **faults)
    if as_json and summary:  # ranks other than 0 of a torchrun island have no summary
        click.echo(json.dumps(summary))
    from p2p_diloco.peers.torchrun.distributed import exit_process

    exit_process(code)


def before_start(island: IslandConfig, log: LogConfig) -> None:
    """What would fail the island at its start, said in one line (exit 2) before anything is built: a
    tracker's package missing, a run directory that cannot be used, an earlier run's checkpoints
    without --resume or --fresh, --resume with none (`peers.state.rundir`; rank 0's directory, the
    only one a torchrun island writes)."""
    from p2p_diloco.peers.state.rundir import check_run_dir

    require_trackers(log.to)
    if os.environ.get("RANK", "0") == "0":
        check_run_dir(island.run_dir, resume=island.resume, fresh=island.fresh)


def island_ports(port: int, dht_port: int | None = None) -> tuple[int, int, int]:
    """(state exchange, DHT, peer exchange) ports of `join --port PORT` (and the config file's [discovery]
    port D): PORT, PORT+1 and PORT+2 when PORT is not 0, else 0 each (any free port); `dht_port` replaces
    the DHT's. A usage error when they would collide or leave the port range."""
    if port and port + PX_PORT_OFFSET > 65535:
        raise click.BadParameter(f"{port} leaves no room for PORT+{PX_PORT_OFFSET} (at most {65535 - PX_PORT_OFFSET})",
                                 param_hint="--port")
    dht = (port + DHT_PORT_OFFSET if port else 0) if dht_port is None else dht_port
    px = port + PX_PORT_OFFSET if port else 0
    if dht and dht in (port, px):
        raise click.BadParameter(f"{dht} is taken by the state exchange ({port}) or the peer exchange ({px})",
                                 param_hint="[discovery] port")
    return port, dht, px


def _schedule_length(train: TrainConfig, block_size: int, diloco: DiLoCoConfig, island: IslandConfig) -> TrainConfig:
    """The inner cosine schedule spans the island's budget when it has one in tokens or rounds (a
    time budget is sized from the first round's speed, in the runner), unless the config file sets
    [train] total_steps."""
    max_tokens, max_rounds = island.max_tokens, island.max_rounds
    if max_tokens:
        return dataclasses.replace(train, total_steps=max(1, max_tokens // (train.batch_size * block_size)))
    if max_rounds:
        return dataclasses.replace(train, total_steps=max_rounds * diloco.local_steps)
    return train
