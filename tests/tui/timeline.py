"""A fixed, deterministic history of a five-island swarm, as real `IslandRecord`s over time.

Used by the state unit tests and the snapshot tests (through `ReplaySource`). What happens, with a
record lifetime of `EXPIRY` seconds and one snapshot a second from `T0`:

- a, b, c, d are there from the start (a started first, at T0 - 120 s); all train and gossip;
- d is slow: it gains a version every 3 s while the others gain one a second, so it falls behind;
- c announces `leaving` at +40 s and its record is withdrawn at +41 s (a clean exit);
- b freezes at +30 s (its record stops changing: killed) and vanishes at +30 + EXPIRY s;
- e joins at +50 s, starting from the freshest version; nobody can dial it (`reach="outbound"`);
- a and c have names (`NAMES`), the others are shown by their peer id's prefix.
"""

from __future__ import annotations

import math

from p2p_diloco.discovery.records import IslandRecord

T0 = 1_700_000_000.0
EXPIRY = 10.0
FRAMES = 60
IDS = {name: (name * 4 + "0123456789abcdef")[:20] for name in "abcde"}
NAMES = {"a": "alpha-gpu", "c": "carol-laptop"}
PORTS = {name: 20000 + i for i, name in enumerate("abcde")}
SPEED = {"a": 3100.0, "b": 2900.0, "c": 3000.0, "d": 1000.0, "e": 3050.0}
"""Tokens per second of each island (d is a third as fast)."""


def record(name: str, t: float, *, version: int, state: str = "training", started: float | None = None) -> IslandRecord:
    """Island `name`'s record as it would announce it at time `t`."""
    tokens = version * 4096
    loss = 2.0 + 3.5 * math.exp(-version / 25.0) + 0.02 * "abcde".index(name)
    partner = "abcde"[("abcde".index(name) + 1 + version % 3) % 4]
    started_at = T0 - 120.0 if name == "a" else (T0 - 60.0 if started is None else started)
    budget = min(1.0, tokens / 2_000_000)  # a budget of 2M tokens
    return IslandRecord(
        peer_id=IDS[name], endpoint=f"tcp://127.0.0.1:{PORTS[name]}", version=version, tokens=tokens,
        tokens_per_s=SPEED[name], loss=loss, eval_loss=loss + 0.05 if version >= 10 else None, state=state,
        upload_bps=1.5e6 + 1e4 * version, download_bps=2.5e6 + 2e4 * version,
        bytes_sent=version * 3_000_000, bytes_received=version * 3_100_000, last_partner=IDS[partner],
        started_at=started_at, timestamp=t, lr=3e-3 * 0.99 ** version, budget=budget,
        eta_s=(t - started_at) * (1 - budget) / budget if budget else None,
        reach="outbound" if name == "e" else "direct", name=NAMES.get(name, ""))


def frame(i: int) -> tuple[float, list[IslandRecord]]:
    """The member list `i` seconds after T0."""
    t = T0 + i
    out = [record("a", t, version=20 + i), record("d", t, version=15 + i // 3)]
    if i < 30:
        out.append(record("b", t, version=19 + i))
    elif i < 30 + EXPIRY:
        out.append(record("b", T0 + 29, version=19 + 29))  # frozen: the same record until it expires
    if i < 40:
        out.append(record("c", t, version=18 + i))
    elif i == 40:
        out.append(record("c", t, version=18 + i, state="leaving"))
    if i >= 50:
        state = "joining" if i < 52 else "training"
        out.append(record("e", t, version=70 + (i - 50), state=state, started=T0 + 49))
    return t, out


def timeline(frames: int = FRAMES) -> list[tuple[float, list[IslandRecord]]]:
    return [frame(i) for i in range(frames)]
