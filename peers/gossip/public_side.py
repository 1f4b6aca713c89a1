"""An island's public state (`exchange="updates"`): what its updates advance, and what a partner's is read against.

The island's first publish starts its public state at the anchor; each later one sends one
compressed update of it (`core.public`), encoded outside the public views' lock and applied under
it (`exchange.public_views`), so that a reader (`own`: the admission's reading of a partner's public
state, `pub_partner - pub_own`) sees it whole, at one version. After the anchor jumped (a catch-up
adopted another state) the next publish starts a new chain there (`restart`). The partners' public
states the gossip worker holds are measured against it (`partner_copies`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from p2p_diloco.core import codecs
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.linkfit import FIRST_CONTACT_WITHIN
from p2p_diloco.core.modes import Exchange
from p2p_diloco.core.params import weights_digest
from p2p_diloco.core.public import PublicCopies, PublicCopy, PublicState, mixed_share
from p2p_diloco.exchange.public_views import PublicView
from p2p_diloco.exchange.server import SnapshotServer
from p2p_diloco.peers.gossip.measure import Measured, measure
from p2p_diloco.peers.identity import Identity


class PublicSide:
    """One island's public state (see the module docstring)."""

    def __init__(self, server: SnapshotServer, outer: OuterLoop, exchange: Exchange, identity: Identity) -> None:
        self.server, self.outer, self.exchange, self.identity = server, outer, exchange, identity
        self.public: PublicState | None = None
        """The public state, from the first publish on."""
        self.chain = 0
        """Which chain a snapshot taken now advances (`restart` starts a new one)."""

    @contextlib.contextmanager
    def own(self) -> Iterator[PublicState | None]:
        """This island's public state, held at one version while the caller reads it."""
        with self.server.public.changing():
            yield self.public

    def partner_copies(self) -> dict:
        """With `exchange="updates"`, what the gossip worker needs to hold its partners' public states
        (`GossipWorker`'s `copies` and `measure_public`: `pub_partner - pub_own`, what mixing adds to the
        anchor, measured against it); else nothing. Called before any state is adopted: every copy
        starts at the run's initial weights."""
        if not self.exchange.updates:
            return {}
        initial = self.outer.state.phi.detach().cpu().clone()
        return {"copies": PublicCopies(initial=initial),
                "measure_public": self._measure}

    def _measure(self, copy: PublicCopy) -> Measured:
        """`pub_partner - pub_own` measured against the anchor; its bounds take the share of it a mix takes
        where updates come in fragments, as the mix does (`peers.gossip.worker.partner_state`): their spans'
        turns are staggered, so the whole difference carries up to `parts` rounds of each side's lag
        (on the gossip worker's thread: the public state is not changed meanwhile)."""
        with self.server.public.changing():
            return measure(self.outer.state.phi, copy.pub, self.outer.state.m, base=self.public.pub,
                           share=mixed_share(copy.parts, self.public.parts))

    def restart(self) -> None:
        """After the anchor jumped (a catch-up adopted another state): the next publish starts a new
        chain there, instead of sending a jump a low-bit update would take many rounds to carry (a
        snapshot taken before the jump advances no chain)."""
        with self.server.public.changing():
            self.public, self.chain = None, self.chain + 1

    def at_start(self) -> bool:
        """Whether the island is in the first `FIRST_CONTACT_WITHIN` versions of a run it started at
        the initial weights (before its first publish: at version 0), where its partners' public
        states are young chains from them: what `auto`'s first contact needs (`peers.gossip.fetchchoice`).
        A joiner or a resumed island starts its chain elsewhere."""
        p = self.public
        if p is None:
            return self.outer.state.version == 0
        return p.from_init and p.version <= FIRST_CONTACT_WITHIN

    @property
    def update_bytes(self) -> int:
        """Bytes of one whole update of the public state (0 without one)."""
        p = self.public
        return 0 if p is None else codecs.encoded_nbytes(p.pub.numel(), p.codec)

    def advance(self, anchor: torch.Tensor | codecs.EncodedVector, parts: int, chain: int, version: int,
                tokens: int) -> None:
        """The first publish starts the public state at the anchor; each later one sends an update,
        encoded outside the lock and applied in place under it (`PublicViews.changing`). An anchor that
        arrives encoded (a test double's) is decoded first."""
        anchor = anchor.float() if isinstance(anchor, codecs.EncodedVector) else anchor
        p = self.public
        update = None if p is None else p.next_update(anchor, parts)
        with self.server.public.changing():
            if chain != self.chain or p is not self.public:
                return  # restarted since the snapshot: the next one starts the chain
            if p is None:  # (the run's initial weights name the run: `run` is their digest)
                at_init = version == 0 and weights_digest(anchor) == self.identity.run
                p = self.public = PublicState(anchor, self.exchange.update_codec, from_init=at_init)
            else:
                p.take(update, parts)
            self.server.publish_public(PublicView(chain=p.chain, version=p.version, pub=p.pub, updates=tuple(p.updates),
                                                  outer_version=version, tokens=tokens, meta=self.identity.meta(),
                                                  digest=weights_digest(p.pub), from_init=p.from_init,
                                                  parts=p.parts))
