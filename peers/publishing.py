"""Publishing an island's outer state: from wherever it lives, through pinned host memory, to the server.

The snapshot server encodes host tensors. An anchor on an accelerator is first copied into a
pinned host buffer (allocated once, reused every round: an asynchronous DMA copy instead of a
pageable one, and no new allocation per round); an anchor on the host is encoded where it is.
What is published: the anchor always, the momentum when it travels (`core.modes.Momentum`, in
its codec); the manifest's meta names the island and its model fingerprint and its run (the
digest of the run's initial weights), so a partner with another model, or from another run,
refuses the state before mixing it.

With `exchange="updates"` the island also advances its public state by one compressed update per
publish (`core.public`) and serves it to partners that ask for it (`exchange.public_views`); the
whole state stays published for joiners, catch-ups and partners that do not ask.
"""

from __future__ import annotations

import time

import torch

from p2p_diloco.core import codecs
from p2p_diloco.core.device import pinned_buffer, to_host
from p2p_diloco.core.island import OuterLoop
from p2p_diloco.core.linkfit import FIRST_CONTACT_WITHIN
from p2p_diloco.core.modes import Exchange
from p2p_diloco.core.params import weights_digest
from p2p_diloco.core.public import PublicCopies, PublicCopy, PublicState, mixed_share
from p2p_diloco.exchange.public_views import PublicView
from p2p_diloco.exchange.server import SnapshotServer
from p2p_diloco.peers.identity import Identity
from p2p_diloco.peers.plausibility import Measured, measure

SERVING_S = 2.0
"""A reply went out this recently: a partner's fetch is under way (a 64 kB chunk takes 1 s at 0.5 Mbit/s)."""


class Publisher:
    """Publishes the state of one island's `OuterLoop` on its `SnapshotServer` (see the module docstring)."""

    def __init__(self, server: SnapshotServer, outer: OuterLoop, exchange: Exchange, identity: Identity) -> None:
        self.server, self.outer, self.exchange, self.identity = server, outer, exchange, identity
        self.published_at = 0.0
        """Unix time of the last publish (the phase of the island's rounds, for pacing)."""
        self._staging: dict[str, torch.Tensor] = {}
        self.public: PublicState | None = None
        """This island's public state (`exchange="updates"`), from its first publish on."""

    def tensors(self) -> dict[str, torch.Tensor]:
        s = self.outer.state
        return {"phi": s.phi, "m": s.m} if self.outer.momentum.travels else {"phi": s.phi}

    def _on_host(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            return x
        buf = self._staging.get(name)
        if buf is None or buf.numel() != x.numel():
            buf = self._staging[name] = pinned_buffer(x.numel(), x.device)
        return to_host(x, buf)

    def publish(self, parts: int = 1) -> None:
        """Encode the state as it is now and serve it from now on (the public state's update in
        `parts` fragments)."""
        s = self.outer.state
        host = {name: self._on_host(name, x) for name, x in self.tensors().items()}
        momentum = self.outer.momentum
        self.server.publish(host, s.version, s.tokens, meta=self.identity.meta(),
                            codec_of={"m": momentum.codec} if momentum.travels else None)
        if self.exchange.updates:
            self._advance_public(host["phi"], parts)
        self.published_at = time.time()

    @property
    def state_bytes(self) -> int:
        """Bytes of the whole state served now (what a partner's fetch of it moves; 0 before the first publish)."""
        latest = self.server.latest()
        return 0 if latest is None else latest[0].total

    def published_last(self) -> None:
        """This island publishes nothing newer: partners waiting for its next version get this one."""
        self.server.published_last()

    def serving(self) -> bool:
        """A partner is fetching from this island: a reply went out within `SERVING_S`."""
        return self.server.sent_within(SERVING_S) > 0

    def partner_copies(self) -> dict:
        """With `exchange="updates"`, what the gossip worker needs to hold its partners' public states
        (`GossipWorker`'s `copies` and `measure_public`: `pub_partner - pub_own`, what mixing adds to the
        anchor, measured against it); else nothing. Called before any state is adopted: every copy
        starts at the run's initial weights."""
        if not self.exchange.updates:
            return {}
        initial = self.outer.state.phi.detach().cpu().clone()
        return {"copies": PublicCopies(initial=initial),
                "measure_public": self._measure_public}

    def _measure_public(self, copy: PublicCopy) -> Measured:
        """`pub_partner - pub_own` measured against the anchor; its bounds take the share of it a mix takes
        where updates come in fragments, as the mix does (`peers.gossip.partner_state`): their spans'
        turns are staggered, so the whole difference carries up to `parts` rounds of each side's lag
        (on the gossip worker's thread: the public state is not changed meanwhile)."""
        with self.server.public.changing():
            return measure(self.outer.state.phi, copy.pub, self.outer.state.m, base=self.public.pub,
                           share=mixed_share(copy.parts, self.public.parts))

    def restart_public(self) -> None:
        """After the anchor jumped (a catch-up adopted another state): the next publish starts a new
        chain there, instead of sending a jump a low-bit update would take many rounds to carry."""
        self.public = None

    def at_start(self) -> bool:
        """Whether the island is in the first `FIRST_CONTACT_WITHIN` versions of a run it started at
        the initial weights (before its first publish: at version 0), where its partners' public
        states are young chains from them: what `auto`'s first contact needs (`peers.fetchchoice`).
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

    def _advance_public(self, anchor: torch.Tensor, parts: int) -> None:
        """The first publish starts the public state at the anchor; each later one sends an update,
        applied in place while the server packs no whole copy of it (`PublicViews.changing`)."""
        with self.server.public.changing():
            if self.public is None:  # (the run's initial weights name the run: `run` is their digest)
                at_init = self.outer.state.version == 0 and weights_digest(anchor) == self.identity.run
                self.public = PublicState(anchor, self.exchange.update_codec, from_init=at_init)
            else:
                self.public.advance(anchor, parts)
            p, s = self.public, self.outer.state
            self.server.publish_public(PublicView(chain=p.chain, version=p.version, pub=p.pub, updates=tuple(p.updates),
                                                  outer_version=s.version, tokens=s.tokens, meta=self.identity.meta(),
                                                  digest=weights_digest(p.pub), from_init=p.from_init,
                                                  parts=p.parts))
