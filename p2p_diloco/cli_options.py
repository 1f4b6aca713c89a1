"""click options for finding the swarm, shared by every command that joins or watches a run.

`join`, `status` and the dashboard all take the same `--bootstrap` (repeatable), `--run-id` and
`--discovery`; decorate a command with `discovery_options` and turn the values into a
`DiscoveryConfig` with `discovery_config(...)`. Environment variables `P2P_DILOCO_BOOTSTRAP`
(space-separated), `P2P_DILOCO_RUN_ID` and `P2P_DILOCO_DISCOVERY` apply to all of them.
Only click is imported here, so `--help` stays instant.
"""

from __future__ import annotations

from typing import Any, Callable

import click

DISCOVERY_CHOICES = ("auto", "dht", "zmq")


def bootstrap_option(required: bool = False) -> Callable:
    return click.option(
        "--bootstrap", "bootstrap", multiple=True, required=required, metavar="ADDR", envvar="P2P_DILOCO_BOOTSTRAP",
        help="Bootstrap address, repeatable: the /ip4/.../p2p/... multiaddr or the tcp://HOST:PORT rendezvous "
             "that `p2p-diloco bootstrap` prints. Joining works if any of them answers.",
    )


def run_id_option() -> Callable:
    return click.option("--run-id", default="default", show_default=True, envvar="P2P_DILOCO_RUN_ID",
                        help="Name of the training run (runs sharing a bootstrap node never see each other).")


def discovery_option() -> Callable:
    return click.option(
        "--discovery", type=click.Choice(DISCOVERY_CHOICES), default="auto", show_default=True,
        envvar="P2P_DILOCO_DISCOVERY",
        help="dht: hivemind DHT; zmq: ZeroMQ rendezvous and peer exchange (no libp2p); "
             "auto: the DHT, or ZeroMQ with a warning when the libp2p daemon cannot start.",
    )


def discovery_options(required: bool = False) -> Callable:
    """`--bootstrap`, `--run-id` and `--discovery` in one decorator."""

    def decorate(f: Callable) -> Callable:
        return bootstrap_option(required)(run_id_option()(discovery_option()(f)))

    return decorate


def discovery_config(bootstrap: tuple[str, ...], run_id: str, discovery: str, **fields: Any):
    """A validated `DiscoveryConfig`; a bad value becomes a `click.BadParameter`-style usage error."""
    from p2p_diloco.config import DiscoveryConfig
    from p2p_diloco.errors import ConfigError

    try:
        return DiscoveryConfig(bootstrap=tuple(bootstrap), run_id=run_id, discovery=discovery, **fields)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
