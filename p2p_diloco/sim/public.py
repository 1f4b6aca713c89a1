"""Public states advanced by compressed updates, with error feedback, for the simulator's gossip.

Instead of its whole state, each island publishes what changed: after each outer step it encodes
the difference between its anchor and its *public state* (`core.compress`, top-k or 4-bit values)
and adds the decoded update to the public state. What the compression dropped stays in that
difference and goes out with a later update (error feedback), so the public state follows the
anchor with a bounded lag and nothing is lost over time. Every island starts from the same initial
weights, so every receiver already holds every public state at version 0.

A receiver that fetched an island's public state at version `v` before needs only the updates since
`v`; one more than `keep` updates behind (or never met, once the sender no longer keeps the updates
from 0) fetches the public state whole, exact, in fp32. The bytes counted per fetch are the
messages' payloads plus `MESSAGE_OVERHEAD` each.

How a receiver mixes what it holds: `pub` mixes the partner's public state as it would the state
itself; `choco` moves its anchor by the difference of the two public states, `a (pub_j - pub_i)`, as
CHOCO-gossip does (Koloskova et al., 2019): both public states lag their anchors alike, so their
difference estimates the anchors' difference better than the lagging public state alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2p_diloco.core import codecs, compress
from p2p_diloco.core.outer import PartnerState
from p2p_diloco.core.params import trainable_parameters
from p2p_diloco.core.public import INIT, encode_update, worth_keeping
from p2p_diloco.exchange.cost import CHAIN, public_fetch_wire_bytes
from p2p_diloco.sim.gossip import GossipRun
from p2p_diloco.sim.lowrank import LowRankEncoder

MESSAGE_OVERHEAD = 256
"""Bytes of headers, manifest and digests around one message's payload (measured on the wire: a
manifest of one small tensor and its chunk header)."""


@dataclass
class _Sender:
    public: torch.Tensor  # the public state now
    sizes: list  # bytes of each update published so far, in order
    snapshot: torch.Tensor  # the public state as of the last publish (what a fetch returns)


class PublicStates:
    """Every island's public state and what each receiver holds of each sender's (see the module docstring)."""

    def __init__(self, initial: list[torch.Tensor], kind: str = "topk", k: int = 64, keep: int = 0,
                 mixing: str = "choco", shapes: list[torch.Size] | None = None) -> None:
        """`keep`: updates a sender keeps (0: as many as an island keeps, `core.public.worth_keeping`);
        `k`: the values kept per block (`topk`) or the rank (`lowrank`, which needs the parameters' `shapes`)."""
        assert mixing in ("pub", "choco"), mixing
        self.low_rank = [LowRankEncoder(shapes, k, seed=i) for i in range(len(initial))] if kind == "lowrank" else None
        numel = initial[0].numel()
        keep = keep or (worth_keeping(numel, kind) if kind in codecs.BLOCK_CODECS else 64)
        self.kind, self.k, self.keep, self.mixing = kind, k, keep, mixing
        self.senders = [_Sender(public=p.detach().float().clone(), sizes=[], snapshot=p.detach().float().clone())
                        for p in initial]
        self.held: dict[tuple[int, int], int] = {}  # (receiver, sender) -> updates held (0: the initial weights)
        self.full_bytes = 4 * initial[0].numel() + MESSAGE_OVERHEAD
        self._wire_cost: dict[tuple, int] = {}  # by (version held, or None for whole; version fetched)

    def publish(self, i: int, anchor: torch.Tensor) -> int:
        """Island `i` publishes the compressed difference of its anchor from its public state; returns
        the update's bytes."""
        s = self.senders[i]
        if self.kind in codecs.BLOCK_CODECS:  # the wire's own codecs: the update an island sends
            update = encode_update(s.public, anchor, self.kind)
            s.public += update.float()
            nbytes = update.buf.numel()
        elif self.low_rank is not None:
            update, nbytes = self.low_rank[i].encode(anchor - s.public)
            s.public += update
        else:
            update = compress.encode(anchor - s.public, self.kind, self.k)
            compress.decode_add(s.public, update)
            nbytes = update.nbytes
        s.sizes.append(nbytes + MESSAGE_OVERHEAD)
        s.snapshot = s.public.clone()
        return s.sizes[-1]

    def fetch(self, receiver: int, sender: int) -> tuple[int, torch.Tensor]:
        """`receiver` brings its copy of `sender`'s public state up to the last publish: the bytes it
        costs, and that public state (published states are never changed in place). With a wire
        codec, the bytes are the messages' (`exchange.cost`): a copy held at `have` (0: the initial
        weights, which every island holds, as `core.public.INIT`) asks for the updates since."""
        s = self.senders[sender]
        have, now = self.held.get((receiver, sender), 0), len(s.sizes)
        self.held[(receiver, sender)] = now
        whole = now - have > self.keep
        if self.kind not in codecs.BLOCK_CODECS:
            return (self.full_bytes if whole else sum(s.sizes[have:now])), s.snapshot
        key = (None if whole else have, now)
        if key not in self._wire_cost:
            self._wire_cost[key] = public_fetch_wire_bytes(s.public.numel(), self.kind, key[0], now,
                                                           (INIT, 0) if have == 0 else (CHAIN, have))
        return self._wire_cost[key], s.snapshot

    def view(self, receiver: int, theirs: torch.Tensor, anchor: torch.Tensor, partner: PartnerState) -> PartnerState:
        """What `receiver` (whose anchor is `anchor`) mixes of a fetched public state `theirs`: that
        state (`pub`), or its anchor moved by the public states' difference (`choco`, so that mixing
        with weight a moves it by a (theirs - its own public state))."""
        phi = theirs.clone() if self.mixing == "pub" else anchor + (theirs - self.senders[receiver].public)
        return PartnerState(phi=phi, m=None, delta=None, version=partner.version, tokens=partner.tokens,
                            peer=partner.peer)


class UpdatesGossipRun(GossipRun):
    """The `gossip` method with `DiLoCoConfig(exchange="updates")`: islands publish compressed updates
    of public states, and a fetch costs the updates the receiver lacks."""

    def __init__(self, simulation) -> None:
        super().__init__(simulation)
        sim = self.sim
        self.public = PublicStates([isl.state.phi for isl in self.islands], self.dl.update_codec, sim.update_k,
                                   sim.update_keep, sim.update_mixing,
                                   shapes=[p.shape for p in trainable_parameters(self.islands[0].model)])
        self.fetched: list[torch.Tensor | None] = [None] * sim.islands  # the public state each fetched this round

    def _fetch(self, i: int, j: int) -> tuple[PartnerState, int]:
        nbytes, self.fetched[i] = self.public.fetch(i, j)
        return self.published[j], nbytes

    def _arrived(self, i: int, partner: PartnerState) -> PartnerState:
        return self.public.view(i, self.fetched[i], self.islands[i].state.phi, partner)

    def _publish(self, i: int) -> None:
        """The update goes out; what a receiver mixes is built from the public state when it arrives
        (`_arrived`), so the published record carries only the version and tokens (no codec round
        trip of the whole state, which nothing would read)."""
        isl = self.islands[i]
        self.public.publish(i, isl.state.phi)
        self.published[i] = PartnerState(phi=self.public.senders[i].snapshot, m=None, delta=None,
                                         version=isl.state.version, tokens=isl.state.tokens, peer=isl.name)
