"""`p2p-diloco bootstrap`: host a bootstrap node, the swarm's entry point (never a coordinator)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import click

from p2p_diloco.cli.options import secret_options, swarm_secret, user_errors
from p2p_diloco.config import DISCOVERY_KINDS, DiscoveryConfig, NetworkConfig
from p2p_diloco.errors import P2PDiLoCoError


@click.command()
@click.option("--host", default=DiscoveryConfig.host, show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=0, show_default=True, help="DHT port (0: any free one); the rendezvous takes PORT+1.")
@click.option("--identity", type=click.Path(dir_okay=False), required=True,
              help="Private key file, created on first start; the same file keeps the same peer id.")
@click.option("--addr-file", type=click.Path(dir_okay=False), default=None, help="Also write the addresses here, one per line.")
@click.option("--rendezvous-port", type=int, default=None, help="Port of the ZeroMQ rendezvous (default: DHT port + 1).")
@click.option("--announce-host", default=DiscoveryConfig.announce_host, help="Address islands should dial (needed with --host 0.0.0.0).")
@click.option("--discovery", type=click.Choice(DISCOVERY_KINDS), default=DiscoveryConfig.discovery, show_default=True,
              help="auto: DHT node and rendezvous (rendezvous only if libp2p fails); dht: DHT only; zmq: rendezvous only.")
@click.option("--relay", is_flag=True, help="Also relay states for islands nobody can dial (behind NAT), on PORT+2 "
              "(or --relay-port): for a swarm with no reachable island but this node.")
@click.option("--relay-port", type=int, default=None, help="Port of the relay (default: DHT port + 2).")
@click.option("--relay-upload-mbps", type=float, default=100.0, show_default=True,
              help="Upload cap of the relay, Mbit/s (what it serves plus what it lets islands push).")
@secret_options("The run's swarm secret, needed by --relay in a run that has one (the relay speaks the exchange's "
                "encryption); the node itself never needs it.")
def bootstrap(host, port, identity, addr_file, rendezvous_port, announce_host, discovery, relay, relay_port,
              relay_upload_mbps, **kw):
    """Host a bootstrap node and print the addresses islands pass to --bootstrap."""
    from p2p_diloco.bootstrap import BootstrapNode

    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)  # the join/leave log is what a bootstrap node is watched for
    with user_errors():  # a bad setting exits 2, like any usage error
        secret = swarm_secret(kw)
        if secret and not relay:
            raise click.UsageError("--secret/--secret-file is used only by --relay (the node never needs it)")
        relay_cfg = NetworkConfig(max_upload_mbps=relay_upload_mbps) if relay else None
        node = BootstrapNode(host=host, port=port, identity=identity, rendezvous_port=rendezvous_port,
                             discovery=discovery, announce_host=announce_host, relay=relay_cfg, relay_port=relay_port,
                             relay_secret=secret)
    stop, received = threading.Event(), []
    owner = os.getpid()

    def on_signal(signum, _frame):
        if os.getpid() != owner:  # the forked DHT process inherited this: there, act as without it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        stop.set()

    # Installed before start(): a signal while the DHT node starts stops it once it is up. With
    # SA_RESTART (`siginterrupt(False)`): torch spins forever on a read that a signal interrupts
    # while it starts its shared-memory manager, which hivemind's DHT makes it do. A SIGHUP ignored
    # on entry (`nohup`) stays ignored: the node then outlives its terminal.
    hangup = [signal.SIGHUP] if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else []
    for sig in (signal.SIGINT, signal.SIGTERM, *hangup):
        signal.signal(sig, on_signal)
        signal.siginterrupt(sig, False)
    try:
        try:
            addrs = node.start()
        except P2PDiLoCoError as e:
            raise click.ClickException(str(e)) from e
        if not stop.is_set():
            _announce(addrs, addr_file)
            node.run_until(stop)
    finally:
        node.shutdown()
    if received and received[0] == signal.SIGINT:
        sys.exit(130)


def _announce(addrs: list[str], addr_file: str | None) -> None:
    """Print the addresses, and write them to `addr_file` atomically (a reader never sees half)."""
    for addr in addrs:
        click.echo(addr)
    if addr_file:
        tmp = f"{addr_file}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(addrs) + "\n")
        os.replace(tmp, addr_file)
