"""The bootstrap node: a well-known entry point (DHT node with a fixed identity + ZeroMQ rendezvous)."""

from p2p_diloco.bootstrap.node import BootstrapNode

__all__ = ["BootstrapNode"]
