"""p2p-diloco: peer-to-peer DiLoCo training with gossip over ZeroMQ and discovery over a DHT.

The Python API: `p2p_diloco.join(model, optimizer, ...)` makes a model and its inner optimizer an
island of a swarm (`p2p_diloco.peers.api`); the config sections are `p2p_diloco.DiLoCoConfig`,
`NetworkConfig`, `DiscoveryConfig` and `IslandConfig`.

Kept import-light on purpose: `p2p-diloco --help` and the dashboard must not pay for torch, so the
API is loaded on first use.
"""

__version__ = "0.1.0"

_LAZY = {"join": "p2p_diloco.peers.api", "SwarmIsland": "p2p_diloco.peers.island",
         "DiLoCoConfig": "p2p_diloco.config", "NetworkConfig": "p2p_diloco.config",
         "DiscoveryConfig": "p2p_diloco.config", "IslandConfig": "p2p_diloco.config"}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'p2p_diloco' has no attribute {name!r}")
