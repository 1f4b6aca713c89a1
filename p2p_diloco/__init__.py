"""p2p-diloco: peer-to-peer DiLoCo training with gossip over ZeroMQ and discovery over a DHT.

Kept import-light on purpose: `p2p-diloco --help` and the dashboard must not pay for torch.
"""

__version__ = "0.1.0"
