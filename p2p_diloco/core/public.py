"""Public states: what an island's partners hold of it, advanced by compressed updates with error feedback.

Instead of its whole state every round, an island (with `exchange="updates"`) sends what changed.
It keeps a *public state*, an fp32 vector that starts as its anchor when it starts. After each
outer step it encodes the difference between its anchor and that public state with a wire codec
(`sign`: one bit per value and a scale per block, or `int4`) and adds the decoded update to the
public state. What the codec dropped stays in the difference and goes out with a later update
(error feedback): the public state follows the anchor with a bounded lag, and nothing is lost.

A partner that holds the public state at version `v` (the count of updates applied) needs only the
updates since `v`; one that holds none, or one further behind than the updates kept, fetches the
public state whole, in fp32 (it must be exact: every later update is added to it). Decoding is
deterministic, so the sender and every receiver hold the same public state bit for bit. A public
state belongs to one *chain*, a random id drawn when the island starts: a restarted island starts a
new chain, and a copy of the old one is useless. A chain that starts at the run's initial weights
(an island that starts the run, rather than joining or resuming it) is also reachable as `INIT`:
every island of the run holds those weights, so its first fetch from a partner costs only the
updates since then, as long as the partner keeps them all.

A receiver mixes the difference of the two public states, as CHOCO-gossip does (Koloskova et al.,
2019): its anchor moves by `a (pub_partner - pub_own)`. Both public states lag their anchors alike,
so their difference estimates the anchors' difference better than a lagging public state alone
(BENCHMARKS.md, "Bandwidth").

*Fragments* (Streaming DiLoCo's, arXiv 2501.18512, in this setting): an update may cover one of
`parts` equal contiguous spans of the vector only, the span of each version taken in turn from a
point drawn from the chain (so islands' turns are staggered), and the rest of the difference waits
for its span's turn (error feedback again). An update then costs `1 / parts` of a whole one, each
span's difference is refreshed once every `parts` rounds, and a receiver mixes the public states'
difference with `1 / parts` of its weight each round (`mixed_share`): over `parts` rounds each span
moves as much as one whole update's mix moves it, as CHOCO-gossip's step follows its compressor's
share. The sender chooses `parts` per update (`core.linkfit`); each update says its span.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from p2p_diloco.config import UPDATE_CODECS
from p2p_diloco.core import codecs
from p2p_diloco.core.codecs import EncodedVector
from p2p_diloco.errors import CodecError

INIT = "init"
"""The chain a receiver names to say it holds the run's initial weights (version 0 of such a chain)."""


APPLY_CHUNK = 1 << 20
"""Values of an update decoded at a time where it is applied."""


def worth_keeping(numel: int, codec: str) -> int:
    """How many whole updates a sender keeps: past that many, the chain costs more than the fp32
    public state a receiver fetches instead (fragments: as many bytes of them)."""
    return max(1, (4 * numel) // codecs.encoded_nbytes(numel, codec))


MAX_KEPT = 56
"""The most updates a sender keeps, whatever their bytes: an answer carries them as tensors, and the
wire carries at most 64 in one manifest (`exchange.manifest.MAX_TENSORS`)."""


def update_name(version: int, at: int, fragment: bool) -> str:
    """The tensor name of the update to `version`: `u<version>`, or `u<version>@<at>` for a fragment
    whose values start at `at`."""
    return f"u{version}@{at}" if fragment else f"u{version}"


def parse_update_names(names: list[str], start: int) -> list[int]:
    """Where each of the updates named `names` (from `start` on, `update_name`) starts; `CodecError`
    for names out of sequence."""
    ats = []
    for k, name in enumerate(names):
        head, _, at = name.partition("@")
        if head != f"u{start + 1 + k}" or (at and not (at.isdigit() and len(at) < 12)):
            raise CodecError(f"updates {start + 1}..{start + len(names)} expected, got {names[:4]}")
        ats.append(int(at) if at else 0)
    return ats


def fragment(numel: int, parts: int, index: int) -> tuple[int, int]:
    """The values `[start, end)` of fragment `index` of `parts`: equal contiguous spans of the vector."""
    return index * numel // parts, (index + 1) * numel // parts


def mixed_share(*parts: int) -> float:
    """The share of the public states' difference mixed per round when updates come in `parts`
    fragments (the most of either side's): each span is refreshed once every that many rounds."""
    return 1.0 / max(1, *parts)


@dataclass(frozen=True)
class Update:
    """One update of a public state: `values` (encoded) added from value `at` on."""

    values: EncodedVector
    at: int = 0

    @property
    def nbytes(self) -> int:
        return self.values.buf.numel()

    def check_fits(self, numel: int) -> None:
        """`CodecError` unless it lies within a public state of `numel` values."""
        if self.at < 0 or self.at + self.values.numel() > numel:
            raise CodecError(f"an update of {self.values.numel()} values at {self.at} for a public state of {numel}")


def encode_update(pub: torch.Tensor, anchor: torch.Tensor, codec: str) -> EncodedVector:
    """The anchor's difference from the public state `pub`, encoded in `codec`: the next update
    (what its decoded values leave out stays in the difference after it is added: error feedback)."""
    flat = anchor.detach().float().cpu().reshape(-1)
    return EncodedVector(codecs.encode_difference(flat, pub, codec), codec, flat.numel())


def apply_(pub: torch.Tensor, update: EncodedVector, at: int = 0) -> torch.Tensor:
    """Add the decoded `update` to `pub[at:]` in place, a slice at a time (no whole-state temporary, and
    no fresh pages to fault in every round: BENCHMARKS.md, "Cost of a round against model size");
    returns `pub`. The caller checked that it fits (`Update.check_fits`)."""
    for start in range(0, update.numel(), APPLY_CHUNK):
        end = min(start + APPLY_CHUNK, update.numel())
        pub[at + start:at + end] += update[start:end].float()
    return pub


class PublicState:
    """The sender's side: its public state, its chain, and the last updates (see the module docstring)."""

    def __init__(self, start: torch.Tensor, codec: str, keep: int | None = None, from_init: bool = False,
                 stagger: int | None = None) -> None:
        """`stagger`: the fragment the first update's turn starts from (None: drawn from the chain)."""
        if codec not in UPDATE_CODECS:
            raise CodecError(f"updates travel in {' or '.join(UPDATE_CODECS)}, not {codec!r}")
        self.pub = start.detach().float().cpu().reshape(-1).clone()
        self.codec = codec
        self.chain = secrets.token_hex(8)
        self.from_init = from_init
        """`start` is the run's initial weights: a receiver naming `INIT` holds version 0."""
        self.version = 0
        """Updates applied so far."""
        self.parts = 1
        """Fragments of the last update (1: whole updates)."""
        self._stagger = int(self.chain[:8], 16) if stagger is None else stagger
        self.updates: deque[Update] = deque()
        self._most = min(keep or MAX_KEPT, MAX_KEPT)
        self._budget = None if keep else 4 * self.pub.numel()
        """Updates are kept up to `_most` and, without a `keep` count, the fp32 public state's bytes."""
        self._kept_bytes = 0

    def advance(self, anchor: torch.Tensor, parts: int = 1) -> Update:
        """Encode the anchor's difference from the public state (of this version's fragment of `parts`),
        apply it (in place: whoever reads `pub` while it changes, as a server packing it whole, holds
        the lock its owner changes it under, `exchange.public_views.PublicViews.changing`), keep it;
        the update."""
        return self.take(self.next_update(anchor, parts), parts)

    def next_update(self, anchor: torch.Tensor, parts: int = 1) -> Update:
        """The update `advance` would apply, encoded from `pub` without changing it (the costly half,
        which a publishing thread runs outside the lock that `take` needs)."""
        flat = anchor.detach().float().cpu().reshape(-1)
        lo, hi = fragment(flat.numel(), parts, (self.version + self._stagger) % parts)
        return Update(encode_update(self.pub[lo:hi], flat[lo:hi], self.codec), lo)

    def take(self, update: Update, parts: int) -> Update:
        """Apply `update` (from `next_update` at this version) in place and keep it; the update."""
        apply_(self.pub, update.values, update.at)
        self.version, self.parts = self.version + 1, parts
        self.updates.append(update)
        self._kept_bytes += update.nbytes
        while len(self.updates) > 1 and (len(self.updates) > self._most or
                                         (self._budget is not None and self._kept_bytes > self._budget)):
            self._kept_bytes -= self.updates.popleft().nbytes
        return update

    def since(self, version: int) -> list[Update] | None:
        return updates_since(self.updates, self.version, version)


def updates_since(updates, version: int, since: int) -> list[Update] | None:
    """Of the last `updates` of a chain now at `version` (the newest last), those that bring its
    public state from `since` to `version`; None when they are not all kept (or `since` is not a
    version the chain had)."""
    first = version - len(updates)  # the version before the oldest kept update
    return list(updates)[since - first:] if first <= since <= version else None


@dataclass
class PublicCopy:
    chain: str
    version: int
    pub: torch.Tensor
    parts: int = 1
    """Fragments of the sender's last update (`mixed_share`)."""


class PublicCopies:
    """The receiver's side: its partners' public states, the `capacity` most recently used (each is
    a full fp32 copy of the state, so their number is bounded)."""

    def __init__(self, capacity: int = 2, initial: torch.Tensor | None = None) -> None:
        """`initial`: the run's initial weights (fp32, host), the start of every `INIT` chain."""
        self.capacity, self.initial = capacity, initial
        self._copies: OrderedDict[str, PublicCopy] = OrderedDict()

    def asking(self, peer: str) -> tuple[str, int] | None:
        """What to tell `peer` this island holds of its public state: its chain and version, `INIT`
        and 0 when it holds none but knows the initial weights, else None (send it whole)."""
        copy = self._copies.get(peer)
        if copy is not None:
            return copy.chain, copy.version
        return None if self.initial is None else (INIT, 0)

    def held(self, peer: str) -> PublicCopy | None:
        return self._copies.get(peer)

    def replace(self, peer: str, chain: str, version: int, pub: torch.Tensor) -> PublicCopy:
        """Hold `pub` (fetched whole) as `peer`'s public state of `chain` at `version`."""
        self._copies.pop(peer, None)
        self._copies[peer] = copy = PublicCopy(chain, version, pub.detach().float().reshape(-1).clone())
        while len(self._copies) > self.capacity:
            self._copies.popitem(last=False)
        return copy

    def advance(self, peer: str, chain: str, start: int, updates: list[Update]) -> PublicCopy:
        """Apply `updates` (from `start` on) to the copy of `peer`'s public state; raise `CodecError`
        when the copy held is not of that chain at that version (it would be silently wrong), or an
        update does not fit it."""
        copy = self._copies.get(peer)
        if copy is None and start == 0 and self.initial is not None:  # the answer to `INIT`
            copy = self.replace(peer, chain, 0, self.initial)
        if copy is None or copy.chain != chain or copy.version != start:
            held = "none" if copy is None else f"chain {copy.chain} at version {copy.version}"
            raise CodecError(f"updates of chain {chain} from version {start} do not apply to the copy held ({held})")
        for u in updates:  # all checked before any is applied
            u.check_fits(copy.pub.numel())
        for u in updates:
            apply_(copy.pub, u.values, u.at)
        copy.version += len(updates)
        self._copies.move_to_end(peer)
        return copy

    def forget(self, peer: str) -> None:
        self._copies.pop(peer, None)
