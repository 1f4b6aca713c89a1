"""The project's exception hierarchy: one root, a few named kinds of failure.

User errors (bad config, bad data path, corrupt checkpoint) raise one of these so the CLI can turn
them into a readable message; programmer errors stay `assert`s.
"""


class P2PDiLoCoError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(P2PDiLoCoError, ValueError):
    """A configuration value is missing, of the wrong type, or out of its allowed range."""


class DataError(P2PDiLoCoError):
    """The training corpus cannot be read or is empty."""


class CodecError(P2PDiLoCoError):
    """A payload cannot be encoded or decoded with the requested codec."""


class CheckpointError(P2PDiLoCoError):
    """A checkpoint is missing, corrupt, or does not match the model."""


class TransportError(P2PDiLoCoError):
    """Moving state between islands failed (socket error, timeout, bad peer)."""


class ProtocolError(TransportError):
    """A message broke the wire protocol (malformed, oversized, wrong version, bad payload)."""


class DiscoveryError(P2PDiLoCoError):
    """Finding or announcing swarm members failed (unreachable bootstrap, bad record)."""
