"""The modes that ship, as small strategy objects chosen once from the config.

Each setting that changes what an island sends or how it mixes names one object here; the code
that runs a round asks that object, never the setting's string:

- `Momentum`: how the outer momentum travels and mixes. `rescaled-int4` (the default) publishes
  it in 4 bits beside the anchor, blends it with the partner's weight and rescales the blend to
  the interpolated norm of the two buffers; `rescaled-sign` does the same with signs and one
  magnitude per block; `local` keeps each island's momentum to itself (NoLoCo).
- `Exchange`: what an island sends. `state`: its whole state each round, partners drawn by
  `peers.gossip.partners`; `updates`: compressed updates of a public state (`core.public`), partners on
  the ring of peer ids, momentum local; `fragments`: those updates, each of one fragment of the
  parameters in turn; `auto`: both published, and each fetch takes the whole state or the updates,
  whichever fits the link the island measured, the updates in as many fragments as the link calls
  for (`core.linkfit`).

What each mode measured is in BENCHMARKS.md ("Momentum that travels", "Sending what changed"); the
variants that were removed, and their figures, are in docs/HISTORY.md ("Modes removed").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2p_diloco.config import EXCHANGES, MAX_FRAGMENTS, MOMENTUM_MODES, UPDATE_CODECS
from p2p_diloco.errors import ConfigError


def blend_(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    """`x <- (1-a) x + a y` in place; written so that a=1/2 is exactly symmetric in x and y.

    `y` may live on another device or still be encoded (`codecs.EncodedVector`): callers pass a
    slice, which decodes and moves as it is read.
    """
    return x.mul_(1 - a).add_(y.to(x.device, non_blocking=True), alpha=a)


@dataclass(frozen=True)
class Momentum:
    """How the outer momentum travels: `codec` is what it is published in (None: it stays local)."""

    name: str
    codec: str | None

    @property
    def travels(self) -> bool:
        """Whether the momentum is published and a partner's is mixed."""
        return self.codec is not None

    def mix_(self, m: torch.Tensor, theirs: torch.Tensor, a: float, scale: float = 1.0) -> None:
        """Mix a partner's momentum slice `theirs`, times `scale`, into ours, `m`, with weight `a`
        (nothing when local).

        Blended, then scaled to `(1-a) |m| + a |theirs|`: two momenta pointing in different
        directions would otherwise shrink each other at every mix."""
        if not self.travels:
            return
        theirs = theirs.to(m.device, non_blocking=True)
        if scale != 1.0:
            theirs = theirs * scale
        target = (1 - a) * m.norm() + a * theirs.norm()
        blend_(m, theirs, a)
        if (norm := m.norm()) > 0:
            m.mul_(target / norm)


@dataclass(frozen=True)
class Exchange:
    """What an island sends: whole states, `update_codec` updates of a public state, or both (`adaptive`)."""

    name: str
    update_codec: str | None = None
    adaptive: bool = False
    """Publish both; each fetch takes whichever fits the measured link (`core.linkfit`)."""
    fragments: int = 1
    """Each update covers one of this many spans of the public state (`core.public.fragment`); with
    `adaptive`, the most the link may call for (`LinkFit.parts`)."""

    @property
    def updates(self) -> bool:
        """Public-state updates (`core.public`) are published (with `adaptive`, beside the whole state)."""
        return self.update_codec is not None

    @property
    def ring(self) -> bool:
        """Every fetch takes updates, from the ring of peer ids (a receiver then lacks one update per
        round); with `adaptive`, the fetches that take updates do."""
        return self.updates and not self.adaptive


MOMENTA = {"rescaled-int4": Momentum("rescaled-int4", "int4"), "rescaled-sign": Momentum("rescaled-sign", "sign"),
           "local": Momentum("local", None)}


def momentum_mode(name: str) -> Momentum:
    """The `Momentum` named `name` (`DiLoCoConfig.momentum`)."""
    try:
        return MOMENTA[name]
    except KeyError:
        raise ConfigError(f"momentum must be one of {', '.join(MOMENTUM_MODES)}, got {name!r}") from None


def exchange_mode(name: str, update_codec: str, fragments: int = 1) -> Exchange:
    """The `Exchange` of `DiLoCoConfig.exchange`, `update_codec` and `fragments` (which only
    `fragments` takes as it is; `auto` chooses up to `MAX_FRAGMENTS`)."""
    if name not in EXCHANGES or update_codec not in UPDATE_CODECS:
        raise ConfigError(f"exchange must be one of {', '.join(EXCHANGES)} and update_codec one of "
                          f"{', '.join(UPDATE_CODECS)}, got {name!r} and {update_codec!r}")
    parts = {"fragments": fragments, "auto": MAX_FRAGMENTS}.get(name, 1)
    return Exchange(name, None if name == "state" else update_codec, adaptive=name == "auto", fragments=parts)
