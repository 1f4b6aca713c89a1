"""The project's exception hierarchy: one root, a few named kinds of failure.

User errors (bad config, bad data path, corrupt checkpoint) raise one of these so the CLI can turn
them into a readable message; programmer errors stay `assert`s.
"""


class P2PDiLoCoError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(P2PDiLoCoError, ValueError):
    """A configuration value is missing, of the wrong type, or out of its allowed range."""


def require(cond: bool, section: str, name: str, rule: str, value: object) -> None:
    """A setting's check: `ConfigError` naming `section.name`, the rule and the value when `cond` is false."""
    if not cond:
        raise ConfigError(f"{section}.{name} must be {rule}, got {value!r}")


class DeviceError(P2PDiLoCoError):
    """The requested --device or --precision is not usable on this machine (no CUDA, no such GPU index,
    no bf16 autocast): a user error the CLI reports in one line, before anything starts."""


class DataError(P2PDiLoCoError):
    """The training corpus cannot be read or is empty."""


class ModelError(P2PDiLoCoError, ValueError):
    """A model cannot take part: no trainable parameters, or parameters the exchange cannot carry."""


class CodecError(P2PDiLoCoError):
    """A payload cannot be encoded or decoded with the requested codec."""


class CheckpointError(P2PDiLoCoError):
    """A checkpoint is missing, corrupt, or does not match the model."""


class TransportError(P2PDiLoCoError):
    """Moving state between islands failed (socket error, timeout, bad peer)."""


class ForeignState(TransportError):
    """A partner's state is of another model or of another run of it (other initial weights)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        """`model` or `run`."""


class ProtocolError(TransportError):
    """A message broke the wire protocol (malformed, oversized, wrong version, bad payload)."""


class DiscoveryError(P2PDiLoCoError):
    """Finding or announcing swarm members failed (unreachable bootstrap, bad record)."""


class BootstrapUnanswered(DiscoveryError):
    """No bootstrap node answered in time: an island retries (`discovery.patience`) until
    `DiscoveryConfig.join_timeout`, an observer gives up at once."""


class JoinStopped(DiscoveryError):
    """The island was asked to stop while it waited for a bootstrap node."""


class TransportTimeout(TransportError):
    """A peer did not answer (or stopped sending) within the allowed time."""


class ConnectionLost(TransportError):
    """The connection to a peer dropped in the middle of an exchange."""


class FetchCancelled(TransportError):
    """The fetch was given up by the island itself (`Fetcher.cancel`), not by the link or the peer."""


class VersionGone(TransportError):
    """The snapshot being fetched was replaced and is no longer served; fetch the new one."""


class AuthRefused(TransportError):
    """The security handshake failed: the two sides do not share the same swarm secret."""


class ProtocolMismatch(ProtocolError):
    """The peer speaks a different major version of the wire protocol."""


class BadPayload(ProtocolError):
    """Received state failed a check: digest mismatch, wrong size, or non-finite values."""
