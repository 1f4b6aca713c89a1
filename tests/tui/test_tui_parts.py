"""The small pure parts of the dashboard: number formats, the braille plot, the terminal check, imports."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from p2p_diloco.tui import format as fmt
from p2p_diloco.tui import should_use_dashboard
from p2p_diloco.tui.plot import Series, bounds, plot


@pytest.mark.parametrize("value, text", [(None, "-"), (0, "0"), (999, "999"), (1234, "1.2k"), (5.6e6, "5.6M"),
                                         (2.5e9, "2.5G")])
def test_si(value, text):
    assert fmt.si(value) == text


def test_rates_sizes_durations_addresses():
    assert [fmt.rate(x) for x in (None, 0.0, 512.0, 4.1e6)] == ["-", "-", "512 B/s", "4.1 MB/s"]
    assert [fmt.size(x) for x in (12, 1234, 894e6, 1.234e9, 56.7e9)] == ["12 B", "1.23 kB", "894 MB", "1.23 GB", "56.7 GB"]
    assert [fmt.duration(x) for x in (None, 4.9, 187, 3720, 2 * 86400 + 3 * 3600)] == ["-", "4s", "3m07s", "1h02m", "2d03h"]
    assert fmt.address("tcp://10.0.0.1:5555") == "10.0.0.1:5555"
    assert fmt.label_cell("island-3") == "island-3" and fmt.label_cell("carol-laptop") == "carol-lap…"
    assert fmt.address_cell("tcp://10.0.0.1:5555", "direct") == "10.0.0.1:5555"
    assert fmt.address_cell("tcp://10.0.0.1:5555", "outbound") == "10.0.0.1:5555 outbound"
    assert fmt.loss(2.34567) == "2.346" and fmt.loss(None) == "-"


def dots(lines) -> list[str]:
    return [line.plain for line in lines]


def test_plot_draws_series_on_one_shared_scale():
    rising = Series([(0, 0.0), (1, 1.0)], "red")
    flat_low = Series([(0, 0.0), (1, 0.0)], "blue")
    lines = plot([rising, flat_low], width=4, height=2)
    assert len(lines) == 2 and all(len(line.plain) == 4 for line in lines)
    top, bottom = dots(lines)
    assert top[0] == " " and top[-1] != " "  # the rising line ends in the top right corner
    assert bottom[0] != " "  # both start bottom left
    assert all(ch != " " for ch in bottom)  # the flat series runs along the bottom, full width
    # the bottom row belongs to the flat series (drawn last) where both pass
    assert lines[1].spans[0].style == "blue"


def test_plot_joins_points_into_a_line_and_handles_edge_cases():
    steep = Series([(0, 0.0), (1, 10.0)], "x")
    lines = dots(plot([steep], width=1, height=3))
    assert all(ch != " " for line in lines for ch in line)  # one column: a vertical run through every row
    assert dots(plot([], 5, 2)) == [" " * 5, " " * 5]
    assert bounds([Series([(0, 3.0), (5, 3.0)], "x")]) == (0, 5, 2.85, 3.15)  # a flat line gets a margin
    assert bounds([Series([(0, 3.0)], "x")], floor=0.0)[2] == 0.0


def test_should_use_dashboard_needs_a_terminal_and_no_ci():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert should_use_dashboard(tty, environ={"TERM": "xterm"})
            assert not should_use_dashboard(tty, environ={"CI": "true", "TERM": "xterm"})
            assert not should_use_dashboard(tty, environ={"TERM": "dumb"})
    finally:
        os.close(master)
        os.close(slave)
    assert not should_use_dashboard(io.StringIO(), environ={})
    r, w = os.pipe()
    with open(w, "w") as piped:
        assert not should_use_dashboard(piped, environ={})
    os.close(r)


def test_the_dashboard_never_imports_torch(tmp_path):
    """`import tui` and a running app on a ZeroMQ source stay free of torch, hivemind and the training core."""
    code = """
import asyncio, sys
from p2p_diloco import tui
from p2p_diloco.config import DiscoveryConfig
from p2p_diloco.tui import MembershipSource, make_app
config = DiscoveryConfig(run_id="t", bootstrap=("tcp://127.0.0.1:9",), discovery="zmq", connect_timeout=0.2)
async def main():
    app = make_app(MembershipSource(config, retry=0.1))
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(40):
            await pilot.pause(0.05)
            if app.state.status == "disconnected":
                break
        assert app.state.status == "disconnected", app.state.status
asyncio.run(main())
bad = sorted(m for m in sys.modules if m in ("torch", "hivemind") or m.startswith("p2p_diloco.core"))
print("heavy:", bad)
sys.exit(1 if bad else 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "heavy: []" in out.stdout


def test_dashboard_command_needs_a_terminal():
    from click.testing import CliRunner

    from p2p_diloco.cli import main

    result = CliRunner().invoke(main, ["dashboard", "--bootstrap", "tcp://127.0.0.1:9", "--discovery", "zmq"])
    assert result.exit_code == 1 and "needs a terminal" in result.output
    result = CliRunner().invoke(main, ["dashboard", "--help"])
    assert result.exit_code == 0 and "--refresh" in result.output and "--bootstrap" in result.output
    result = CliRunner().invoke(main, ["dashboard", "--run-id", "x"])
    assert result.exit_code == 2 and "--bootstrap" in result.output
