"""The bootstrap node: a well-known entry point (DHT node with a fixed identity + ZeroMQ rendezvous)."""

from bootstrap.node import BootstrapNode

__all__ = ["BootstrapNode"]
