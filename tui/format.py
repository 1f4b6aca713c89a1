"""Short, fixed-width renderings of the numbers the dashboard shows (rates, sizes, durations, ids).

Kept apart from the widgets so the state layer, the widgets and the tests all agree on one
spelling: a column of `12.3k` tokens/s or `4.1 MB/s` reads at a glance, and `-` always means
"not reported yet".
"""

from __future__ import annotations

import time


LABEL_CELL = 10
"""Characters of an island's label the peers table and the loss legend show (the detail view shows all)."""


def label_cell(label: str, width: int = LABEL_CELL) -> str:
    """An island's label cut to `width` characters, the cut marked with `…`."""
    return label if len(label) <= width else label[: width - 1] + "…"


def address(endpoint: str) -> str:
    """`tcp://host:port` -> `host:port`."""
    return endpoint.removeprefix("tcp://")


REACH = {"direct": "direct (others dial it)",
         "outbound": "outbound-only (nobody can dial it: it fetches from others and pushes its state to them)"}
"""How the detail view spells an island's `reach`."""


def address_cell(endpoint: str, reach: str) -> str:
    """The peers table's address: `host:port`, marked `outbound` when nobody can dial it."""
    return address(endpoint) + (" outbound" if reach == "outbound" else "")


def si(value: float | None, unit: str = "", digits: int = 1) -> str:
    """1234 -> `1.2k`, 5.6e6 -> `5.6M` (decimal prefixes, as link rates are quoted)."""
    if value is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}f}{prefix}{unit}"
    return f"{value:.0f}{unit}"


def rate(bytes_per_s: float | None) -> str:
    """Bytes per second as `4.1 MB/s`; `-` when idle or unknown."""
    if not bytes_per_s:
        return "-"
    return f"{bytes_per_s:.0f} B/s" if bytes_per_s < 1e3 else _spaced(si(bytes_per_s, "B/s"))


def size(n_bytes: float | None) -> str:
    """A byte count with three significant digits: `894 MB`, `1.23 GB`."""
    if n_bytes is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n_bytes >= factor:
            x = n_bytes / factor
            return f"{x:.{0 if x >= 100 else 1 if x >= 10 else 2}f} {prefix}B"
    return f"{n_bytes:.0f} B"


def _spaced(text: str) -> str:
    """`4.1MB/s` -> `4.1 MB/s`: a space between the number and its prefixed unit."""
    for i, ch in enumerate(text):
        if ch.isalpha():
            return f"{text[:i]} {text[i:]}"
    return text


def loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def lr(value: float | None) -> str:
    """A learning rate, `3.00e-03` (`-`: not reported)."""
    return "-" if value is None else f"{value:.2e}"


def budget(done: float | None, eta_s: float | None) -> str:
    """The share of an island's budget spent and the time left, `45% done, eta 4m10s` (`none`: no budget)."""
    if done is None:
        return "none"
    return f"{100 * done:.0f}% done" + ("" if eta_s is None else f", eta {duration(eta_s)}")


def share(value: float) -> str:
    """A share of time such as utilization ("0.973"; "-" for 0: none measured yet)."""
    return f"{value:.3f}" if value else "-"


def duration(seconds: float | None) -> str:
    """`42s`, `3m07s`, `1h02m`, `2d03h`: the two most significant units."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(t: float) -> str:
    """Unix time as local `HH:MM:SS` (the event log's time column)."""
    return time.strftime("%H:%M:%S", time.localtime(t))
