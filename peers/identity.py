"""Who an island is, as its partners check it: peer id, label, model fingerprint, run.

One object, shared by the parts that publish, check and record (`peers.gossip.publishing`,
`peers.gossip.reach`, `peers.state.source`, `peers.island`): a resumed island takes its checkpoint's run, and
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

    def foreign(self, meta: dict, strict: bool = False) -> tuple[str, str] | None:
        """(`model` or `run`, why) when a manifest's `meta` names another model or run than this
        island's (None: it does not); `strict`: a manifest that names none is foreign too (a push)."""
        for key, ours, what in (("model", self.model, "another model (fingerprint"),
                                ("run", self.run, "another run (initial weights")):
            theirs = str(meta.get(key, ""))
            if ours and (theirs or strict) and theirs != ours:
                return key, f"{what} {theirs[:16]}, this island's {ours})"
        return None

    def meta(self) -> dict[str, str]:
        """What every manifest this island publishes says of it."""
        return {"peer_id": self.peer_id, "model": self.model, "run": self.run}
