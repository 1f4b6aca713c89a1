"""Who an island is, as its partners check it: peer id, label, model fingerprint, run.

One object, shared by the parts that publish, check and record (`peers.publishing`,
`peers.reach`, `peers.state`, `peers.island`): a resumed island takes its checkpoint's run, and
every part sees it at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Identity:
    peer_id: str
    """The island's peer id (its discovery key)."""
    name: str
    """Its label in logs, records, progress lines and the dashboard."""
    model: str
    """The fingerprint of its model's trainable parameters (`core.params.fingerprint`)."""
    run: str
    """The digest of the run's initial weights (`core.params.weights_digest`): states of another run are refused."""

    def meta(self) -> dict[str, str]:
        """What every manifest this island publishes says of it."""
        return {"peer_id": self.peer_id, "model": self.model, "run": self.run}
