"""Public states advanced by compressed updates, with error feedback, for the simulator's gossip.

Instead of its whole state, each island publishes what changed: after each outer step it encodes
the difference between its anchor and its *public state* in the update codec (`core.public`, the
wire's own `sign` or `int4`, the island's own `PublicState`), of the whole vector or of one of its
fragments, and adds the decoded update to the public state. What the codec dropped stays in that
difference and goes out with a later update (error feedback), so the public state follows the
anchor with a bounded lag and nothing is lost over time. Every island starts from the same initial
weights, so every receiver already holds every public state at version 0. Island `i`'s fragments
take their turns from `i` on (the swarm's islands draw theirs from their chain).

A receiver that fetched an island's public state at version `v` before needs only the updates since
`v`; one behind the updates kept fetches the public state whole, exact, in fp32. Each fetch is
charged the messages a real one moves (`exchange.cost.public_fetch_wire_bytes`).

A receiver moves its anchor by the difference of the two public states, `a (pub_j - pub_i)`, as
CHOCO-gossip does (Koloskova et al., 2019) and as the swarm does (`peers.gossip.worker.partner_state`),
by `core.public.mixed_share` of it where updates come in fragments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.public import INIT, PublicCopy, PublicState, mixed_share
from p2p_diloco.exchange.cost import CHAIN, public_fetch_wire_bytes
from p2p_diloco.sim.gossip import GossipRun


@dataclass
class _Sender:
    state: PublicState
    snapshot: PublicCopy  # the public state as of the last publish (what a fetch returns)


class PublicStates:
    """Every island's public state and what each receiver holds of each sender's (see the module docstring)."""

    def __init__(self, initial: list[torch.Tensor], codec: str, keep: int = 0) -> None:
        """`keep`: updates a sender keeps (0: as an island keeps them, by bytes)."""
        self.codec = codec
        self.senders = []
        for i, p in enumerate(initial):
            state = PublicState(p, codec, keep=keep or None, from_init=True, stagger=i)
            self.senders.append(_Sender(state, PublicCopy(CHAIN, 0, state.pub.clone())))
        self.held: dict[tuple[int, int], int] = {}  # (receiver, sender) -> updates held (0: the initial weights)
        self._wire_cost: dict[tuple, int] = {}

    def publish(self, i: int, anchor: torch.Tensor, parts: int = 1) -> None:
        """Island `i` publishes the encoded difference of its anchor from its public state (in `parts` fragments)."""
        s = self.senders[i]
        s.state.advance(anchor, parts)
        s.snapshot = PublicCopy(CHAIN, s.state.version, s.state.pub.clone(), parts)

    def fetch(self, receiver: int, sender: int) -> tuple[int, PublicCopy]:
        """`receiver` brings its copy of `sender`'s public state up to the last publish: the bytes the
        messages cost (`exchange.cost`; a copy held at `have`, 0 being the initial weights every
        island holds, as `core.public.INIT`, asks for the updates since), and that public state
        (published states are never changed in place)."""
        s = self.senders[sender]
        have, now = self.held.get((receiver, sender), 0), s.state.version
        self.held[(receiver, sender)] = now
        updates = s.state.since(have)
        spans = None if updates is None else tuple((u.at, u.values.numel()) for u in updates)
        key = (None if updates is None else have, now, spans, s.snapshot.parts)
        if key not in self._wire_cost:
            self._wire_cost[key] = public_fetch_wire_bytes(s.state.pub.numel(), self.codec, key[0], now,
                                                           (INIT, 0) if have == 0 else (CHAIN, have), spans=spans,
                                                           parts=s.snapshot.parts)
        return self._wire_cost[key], s.snapshot

    def view(self, receiver: int, theirs: PublicCopy, anchor: torch.Tensor, partner: PartnerState) -> PartnerState:
        """What `receiver` (whose anchor is `anchor`) mixes of a fetched public state `theirs`: its
        anchor moved by the public states' difference, so that mixing with weight a moves it by
        a (theirs - its own public state), or `mixed_share` of that."""
        own = self.senders[receiver].state
        phi = anchor + (theirs.pub - own.pub) * mixed_share(theirs.parts, own.parts)
        return PartnerState(phi=phi, m=None, version=partner.version, tokens=partner.tokens, peer=partner.peer)


class UpdatesGossipRun(GossipRun):
    """The `gossip` method with `DiLoCoConfig(exchange="updates")` (or `"fragments"`): islands publish
    compressed updates of public states, and a fetch costs the updates the receiver lacks."""

    def __init__(self, simulation) -> None:
        super().__init__(simulation)
        sim = self.sim
        self.public = PublicStates([isl.state.phi for isl in self.islands], self.exchange.update_codec,
                                   sim.update_keep)
        self.fetched: list[PublicCopy | None] = [None] * sim.islands  # the public state each fetched this round

    def _fetch(self, i: int, j: int) -> tuple[PartnerState, int]:
        nbytes, self.fetched[i] = self.public.fetch(i, j)
        return self.published[j], nbytes

    def _arrived(self, i: int, partner: PartnerState) -> PartnerState:
        return self.public.view(i, self.fetched[i], self.islands[i].state.phi, partner)

    def _parts(self, i: int) -> int:
        """The fragments island `i`'s next update goes in."""
        return self.exchange.fragments

    def _publish(self, i: int) -> None:
        """The update goes out; what a receiver mixes is built from the public state when it arrives
        (`_arrived`), so the published record carries only the version and tokens (no codec round
        trip of the whole state, which nothing would read)."""
        isl = self.islands[i]
        self.public.publish(i, isl.state.phi, self._parts(i))
        self.published[i] = PartnerState(phi=self.public.senders[i].snapshot.pub, m=None,
                                         version=isl.state.version, tokens=isl.state.tokens, peer=isl.name)
