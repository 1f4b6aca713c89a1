"""Link emulation (pacer), bandwidth-aware window sizing, and the network section of the config."""

from __future__ import annotations

import math

import pytest

from p2p_diloco.config import NetworkConfig
from p2p_diloco.errors import ConfigError
from p2p_diloco.exchange import flowcontrol
from p2p_diloco.exchange.linkemu import Pacer, link_rate

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_pacer_serializes_at_the_link_rate_then_adds_the_one_way_delay():
    clock = Clock()
    p = Pacer(latency_ms=100, bytes_per_s=125e6, clock=clock)  # 1 Gbit/s
    assert p.active
    for i in range(3):
        p.schedule(MiB, i)
    serial = MiB / 125e6
    arrivals = [100 + k * serial + 0.1 for k in (1, 2, 3)]
    assert p.next_due() == pytest.approx(100 + serial)  # the link frees up: the next message starts
    clock.t = arrivals[0] - 1e-6
    assert p.pop_due() == []
    clock.t = arrivals[1] + 1e-9
    assert p.pop_due() == [0, 1] and len(p) == 1
    clock.t = 200.0  # the link went idle: the next message starts now, not in the past
    p.schedule(10, "late")
    clock.t = 200 + 10 / 125e6 + 0.1
    assert p.pop_due() == [2, "late"] and len(p) == 0 and p.next_due() is None


def test_pacer_serves_flows_round_robin_and_drops_a_flow_backlog_for_free():
    clock = Clock()
    p = Pacer(bytes_per_s=1e6, clock=clock)  # 1 MB/s: a 100 kB message takes 0.1 s
    for i in range(5):
        p.schedule(100_000, ("big", i), flow="big")
    p.schedule(1_000, ("small", 0), flow="small")
    clock.t += 0.101
    assert p.pop_due() == [("big", 0)]
    clock.t = 100.2011  # big 1 arrived; small 0 took the next turn, before big 2
    assert p.pop_due() == [("big", 1), ("small", 0)] and p.held("big") == 3
    assert p.drop("big") == 2  # big 2 is already on the wire; 3 and 4 never cost link time
    clock.t += 1.0
    assert p.pop_due() == [("big", 2)] and len(p) == 0


def test_pacer_with_latency_only_keeps_order_and_inactive_pacer_holds_nothing():
    clock = Clock()
    p = Pacer(latency_ms=20, clock=clock)
    for i in range(5):
        p.schedule(10**6, i)
        clock.t += 0.001
    clock.t += 1
    assert p.pop_due() == [0, 1, 2, 3, 4]
    assert not Pacer().active


def test_link_rate_takes_the_slower_of_emulation_and_cap():
    assert link_rate(None, None) is None
    assert link_rate(1000, None) == 125e6
    assert link_rate(1000, 80) == 10e6


def _controller(**kw):
    args = dict(min_chunk=64 * 1024, max_chunk=8 * MiB, initial_window=8 * MiB, max_window=64 * MiB)
    args.update(kw)
    return flowcontrol.WindowController(**args)


def test_window_starts_at_the_initial_value_then_follows_twice_the_bdp():
    c = _controller()
    block = 64 * 1024
    assert c.window_bytes(block) == 8 * MiB and c.chunk_bytes(block) == block  # not measured: the smallest chunk
    c.on_rtt(0.2)
    t = 0.0
    for _ in range(20):  # 1 MiB chunks arriving back to back at 125 MB/s
        t += MiB / 125e6
        c.on_delivery(MiB, t)
    assert c.bandwidth == pytest.approx(125e6, rel=1e-6)
    assert c.window_bytes(block) == pytest.approx(2 * 125e6 * 0.2, rel=1e-6)  # 2 x BDP = 50 MB
    assert c.chunk_bytes(block) == MiB // 2  # 125 MB/s x 8 ms = 1 MB, rounded down to a power of two


def test_window_and_chunk_stay_within_bounds():
    block = 64 * 1024
    fast = _controller(prior=flowcontrol.LinkEstimate(rtt_s=1.0, bytes_per_s=10e9))
    assert fast.chunk_bytes(block) == 8 * MiB and fast.window_bytes(block) == 64 * MiB
    slow = _controller(prior=flowcontrol.LinkEstimate(rtt_s=0.0001, bytes_per_s=1e5))
    assert slow.chunk_bytes(block) == 64 * 1024 and slow.window_bytes(block) == 3 * 64 * 1024
    big_block = _controller(prior=flowcontrol.LinkEstimate(rtt_s=0.0001, bytes_per_s=1e5))
    assert big_block.chunk_bytes(256 * 1024) == 256 * 1024  # never below the manifest's block


def test_a_remembered_round_trip_seeds_the_window_but_a_fetch_reports_and_keeps_its_own():
    # the peer at an endpoint changed (another island took its port, or its path got slower): what
    # this fetch measures wins, though larger than what was remembered (a port reused between two
    # of the suite's servers, one with 30 ms of emulated latency, once reported the other's 4 ms)
    c = _controller(prior=flowcontrol.LinkEstimate(rtt_s=0.02, bytes_per_s=125e6))
    assert c.rtt == 0.02 and c.window_bytes(64 * 1024) == pytest.approx(2 * 125e6 * 0.02, rel=1e-6)
    c.on_rtt(0.061)
    assert c.rtt == c.min_rtt == 0.061 and c.estimate().rtt_s == 0.061
    assert _controller().rtt == math.inf and _controller().estimate() is None


def test_estimates_are_remembered_per_endpoint():
    flowcontrol.remember("tcp://127.0.0.1:1", flowcontrol.LinkEstimate(rtt_s=0.1, bytes_per_s=5e6))
    flowcontrol.remember("tcp://127.0.0.1:2", None)
    assert flowcontrol.remembered("tcp://127.0.0.1:1").bytes_per_s == 5e6
    assert flowcontrol.remembered("tcp://127.0.0.1:2") is None


@pytest.mark.parametrize("field, value", [
    ("compression", "zip"), ("min_chunk_bytes", 1024), ("max_chunk_bytes", 16 * MiB), ("max_chunk_bytes", 1000),
    ("initial_window_bytes", 1000), ("max_window_bytes", MiB), ("max_upload_mbps", 0), ("fetch_timeout_s", 0), ("retain_snapshots", 0),
])
def test_network_config_names_the_bad_field(field, value):
    with pytest.raises(ConfigError, match=f"network.{field}"):
        NetworkConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("latency_ms", -1), ("latency_ms", 20_000), ("bandwidth_mbps", -5)])
def test_an_emulated_link_names_the_bad_field_and_is_no_network_setting(field, value):
    """Link emulation is a test double (`bench member`): `EmulatedLink`, never a `NetworkConfig` field."""
    from p2p_diloco.exchange.linkemu import EmulatedLink

    with pytest.raises(ConfigError, match=f"link {field}"):
        EmulatedLink(**{field: value})
    assert not hasattr(NetworkConfig(), field)


def test_discovery_config_hides_the_secret_and_is_its_one_home():
    from p2p_diloco.config import DiscoveryConfig

    assert "hunter2" not in repr(DiscoveryConfig(secret="hunter2"))
    assert not hasattr(NetworkConfig(), "secret")


def _published(version: int):
    import torch

    from p2p_diloco.exchange import payload

    return payload.Published.of(*payload.pack({"phi": torch.full((64,), float(version))}, "fp32",
                                               version=version, tokens=version))


def test_the_shelf_keeps_the_newest_and_what_a_fetch_still_reads_within_bounds():
    from p2p_diloco.exchange.shelf import Shelf

    shelf = Shelf(retain=1, hold_s=10.0, extra=2)
    snaps = [_published(v) for v in range(5)]
    shelf.put(snaps[0], now=0.0)
    assert shelf.get(snaps[0].manifest.sid, now=1.0) is snaps[0]  # a fetch reads version 0
    shelf.drop_oldest(now=2.0)  # before packing version 1: version 0 is being read, so it stays
    shelf.put(snaps[1], now=2.0)
    assert shelf.held() == [snaps[0].manifest.sid, snaps[1].manifest.sid] and shelf.latest is snaps[1]
    shelf.get(snaps[1].manifest.sid, now=3.0)
    shelf.put(snaps[2], now=4.0)
    shelf.get(snaps[2].manifest.sid, now=5.0)
    shelf.put(snaps[3], now=6.0)  # three older ones are read: the two read last stay (extra=2)
    assert shelf.held() == [s.manifest.sid for s in snaps[1:4]]
    assert shelf.get(snaps[0].manifest.sid, now=6.0) is None  # its reader gets `gone`
    shelf.put(snaps[4], now=14.0)  # version 1's reader is silent for 11 s (> hold_s): it failed
    assert shelf.held() == [snaps[2].manifest.sid, snaps[4].manifest.sid]
    shelf.put(_published(5), now=30.0)  # nobody reads: only the newest
    assert len(shelf.held()) == 1


def test_a_fetch_over_a_slow_link_allows_a_few_chunks_of_silence():
    """On a slow uplink shared with other fetches one chunk can take longer than the timeout: a link
    measured before, or the rate the caller measured of its partners, lengthens it."""
    from p2p_diloco.exchange.flowcontrol import SILENCE_CHUNKS, LinkEstimate, WindowController
    from p2p_diloco.exchange.wire import MIN_CHUNK

    cfg = NetworkConfig()

    def silence_allowed(timeout, ctl, rate_hint=0.0):
        return ctl.silence_s(timeout, MIN_CHUNK, rate_hint)

    assert silence_allowed(10.0, WindowController.for_config(cfg)) == 10.0  # nothing known: the timeout
    slow = LinkEstimate(rtt_s=0.2, bytes_per_s=9000.0)  # 0.072 Mbit/s: a 64 KiB chunk in 7.3 s
    allowed = silence_allowed(10.0, WindowController.for_config(cfg, prior=slow))
    assert allowed == pytest.approx(SILENCE_CHUNKS * MIN_CHUNK / 9000.0) and allowed > 25
    assert silence_allowed(10.0, WindowController.for_config(cfg), rate_hint=9000.0) == allowed
    fast = LinkEstimate(rtt_s=0.001, bytes_per_s=1e9)
    assert silence_allowed(10.0, WindowController.for_config(cfg, prior=fast), rate_hint=9000.0) == 10.0
