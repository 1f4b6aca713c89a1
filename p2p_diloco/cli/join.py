"""`p2p-diloco join`: start an island (also as one rank of a torchrun group).

`--port P` (P != 0) fixes every port an island listens on, to open in a firewall: the state
exchange on P, the DHT on P+1 (or `--dht-port`), the ZeroMQ peer exchange on P+2 (`island_ports`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from p2p_diloco.cli.config_file import apply_advanced
from p2p_diloco.cli.options import (
    build_configs, device_options, diloco_options, discovery_config, discovery_options, model_options, network_config,
    config_file_option, grouped, network_options, retired_option, swarm_secret, user_errors
)
from p2p_diloco.config import (
    DHT_PORT_OFFSET, PX_PORT_OFFSET, REACH_MODES, DiLoCoConfig, DiscoveryConfig, IslandConfig, TrainConfig
)

I = IslandConfig
JOIN_GROUPS = {
    "The swarm": ("bootstrap", "run_id", "secret", "secret_file", "discovery", "host", "announce_host", "port",
                  "dht_port", "reach", "wait_for"),
    "Model and data": ("model_size", "n_layer", "n_embd", "n_head", "block_size", "data", "vocab_size", "seed",
                       "batch_size", "lr", "device", "precision", "threads"),
    "Training": ("local_steps", "outer_lr", "outer_momentum", "momentum", "exchange", "update_codec", "final_mix",
                 "max_tokens", "max_rounds", "max_seconds", "round_seconds", "run_dir", "resume", "eval_every",
                 "checkpoint_every", "offload_outer"),
    "Network": ("compression", "max_upload_mbps", "fetch_timeout"),
    "Output": ("name", "quiet", "as_json", "help"),
}
"""How `join --help` lists its options."""


@click.command(cls=grouped(JOIN_GROUPS))
@discovery_options()
@model_options
@diloco_options
@device_options
@network_options
@click.option("--round-seconds", type=float, default=DiLoCoConfig.round_seconds, help="Time budget of one round's inner steps.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=str(I.run_dir), show_default=True,
              help="Folder for metrics.jsonl and checkpoints.")
@click.option("--max-tokens", type=int, default=I.max_tokens, help="Stop after this island trained this many tokens.")
@click.option("--max-rounds", type=int, default=I.max_rounds, help="Stop after this many rounds.")
@click.option("--max-seconds", type=float, default=I.max_seconds, help="Stop after this many seconds of training.")
@click.option("--resume", is_flag=True, default=I.resume, help="Continue from the last checkpoint in --run-dir.")
@config_file_option("same_version_wait", "island")
@config_file_option("max_stretch", "island")
@config_file_option("mix_weight", "diloco")
@config_file_option("max_staleness", "diloco")
@click.option("--wait-for", type=click.IntRange(min=1), default=I.wait_for, show_default=True,
              help=f"Before the first round, wait (up to {I.join_timeout_s:g} s) until this many islands, this one "
                   "included, are in the run.")
@click.option("--host", default=DiscoveryConfig.host, show_default=True, help="Address the state exchange, DHT and peer exchange listen on.")
@click.option("--announce", "announce_host", default=DiscoveryConfig.announce_host,
              help="Address others should dial (when --host is not reachable as such).")
@click.option("--port", type=click.IntRange(0, 65535 - PX_PORT_OFFSET), default=I.port, show_default=True,
              help=f"State exchange port; the DHT takes PORT+{DHT_PORT_OFFSET} and the ZeroMQ peer exchange "
                   f"PORT+{PX_PORT_OFFSET}: open these in a firewall (0: any free ports).")
@click.option("--dht-port", type=click.IntRange(0, 65535), default=None,
              help=f"DHT port instead of PORT+{DHT_PORT_OFFSET} (0: any free port).")
@click.option("--reach", type=click.Choice(REACH_MODES), default=I.reach, show_default=True,
              help="auto: at start the bootstrap node dials this island to learn whether others can reach it; "
                   "direct: assume they can; outbound: they cannot, so nobody dials this island; it fetches from "
                   "reachable islands and pushes its state to them.")
@click.option("--seed", type=int, default=TrainConfig.seed, show_default=True,
              help="Run seed: the initial weights every island shares.")
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads for this island.")
@click.option("--eval-every", type=int, default=I.eval_every, show_default=True, help="Rounds between held-out evaluations.")
@click.option("--checkpoint-every", type=int, default=I.checkpoint_every, show_default=True, help="Rounds between checkpoints.")
@click.option("--name", default=I.name, help="Label for the progress line.")
@click.option("--quiet", is_flag=True, default=I.quiet, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the island's summary as JSON at exit.")
@retired_option("--slowdown", "fault injection lives in `p2p-diloco bench member --slowdown`", figures=False)
@retired_option("--poison", "fault injection lives in `p2p-diloco bench member --poison`", figures=False)
@retired_option("--latency-ms", "link emulation lives in `p2p-diloco bench member --latency-ms`", figures=False, type=float)
@retired_option("--bandwidth-mbps", "link emulation lives in `p2p-diloco bench member --bandwidth-mbps`", figures=False,
                type=float)
def join(**kw) -> None:
    """Start an island: find the swarm, train rounds, gossip with partners, checkpoint."""
    run_join(kw)


def run_join(kw: dict, **faults) -> None:
    """The body of `join` (and of `bench member`, which passes `faults` on to `run_island`)."""
    import torch

    from p2p_diloco.core.device import autocast, resolve_device
    from p2p_diloco.peers.process import run_island

    torch.set_num_threads(kw.pop("threads"))
    with user_errors():
        # one swarm secret seals discovery records and keys the state exchange (docs/SECURITY.md)
        port, dht_port, px_port = island_ports(kw["port"], kw.pop("dht_port"))
        discovery = discovery_config(kw.pop("bootstrap"), kw.pop("run_id"), kw.pop("discovery"),
                                     host=kw["host"], announce_host=kw["announce_host"], secret=swarm_secret(kw),
                                     port=dht_port, px_port=px_port, outbound_only=kw["reach"] == "outbound")
        data, vocab_size, as_json = kw.pop("data"), kw.pop("vocab_size"), kw.pop("as_json")
        model, train, diloco = build_configs(kw)
        # an unusable device or precision fails here, in one line, before the swarm starts
        autocast(resolve_device(train.device), train.precision)
        diloco = dataclasses.replace(diloco, round_seconds=kw.pop("round_seconds"))
        train = _schedule_length(train, model.resolved()["block_size"], diloco, kw["max_tokens"], kw["max_rounds"])
        network = network_config(kw)
        island = IslandConfig(run_dir=Path(kw["run_dir"]), port=port, reach=kw["reach"], max_tokens=kw["max_tokens"],
                              max_rounds=kw["max_rounds"],
                              max_seconds=kw["max_seconds"], resume=kw["resume"], eval_every=kw["eval_every"],
                              checkpoint_every=kw["checkpoint_every"], name=kw["name"], quiet=kw["quiet"],
                              wait_for=kw["wait_for"])
        c = apply_advanced({"island": island, "model": model, "train": train, "diloco": diloco, "network": network,
                            "discovery": discovery})
        code, summary = run_island(c["island"], c["model"], c["train"], c["diloco"], c["network"], c["discovery"], data,
                                   vocab_size=vocab_size, **faults)
    if as_json and summary:  # ranks other than 0 of a torchrun island have no summary
        click.echo(json.dumps(summary))
    sys.exit(code)


def island_ports(port: int, dht_port: int | None = None) -> tuple[int, int, int]:
    """(state exchange, DHT, peer exchange) ports of `join --port PORT [--dht-port D]`: PORT, PORT+1 and
    PORT+2 when PORT is not 0, else 0 each (any free port); `dht_port` replaces the DHT's. A usage error
    when they would collide or leave the port range."""
    if port and port + PX_PORT_OFFSET > 65535:
        raise click.BadParameter(f"{port} leaves no room for PORT+{PX_PORT_OFFSET} (at most {65535 - PX_PORT_OFFSET})",
                                 param_hint="--port")
    dht = (port + DHT_PORT_OFFSET if port else 0) if dht_port is None else dht_port
    px = port + PX_PORT_OFFSET if port else 0
    if dht and dht in (port, px):
        raise click.BadParameter(f"{dht} is taken by the state exchange ({port}) or the peer exchange ({px})",
                                 param_hint="--dht-port")
    return port, dht, px


def _schedule_length(train: TrainConfig, block_size: int, diloco: DiLoCoConfig, max_tokens: int | None,
                     max_rounds: int | None) -> TrainConfig:
    """The inner cosine schedule spans the island's budget when it has one in tokens or rounds (a
    time budget is sized from the first round's speed, in the runner)."""
    if max_tokens:
        return dataclasses.replace(train, total_steps=max(1, max_tokens // (train.batch_size * block_size)))
    if max_rounds:
        return dataclasses.replace(train, total_steps=max_rounds * diloco.local_steps)
    return train
