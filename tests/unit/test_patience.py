"""Patient joining (`discovery.patience.keep_trying`): the retry policy on its own, with attempts that
fail as an unanswered bootstrap does. Real bootstrap nodes started late are in
tests/integration/test_patient_join.py."""

import logging
import random
import time

import pytest

from p2p_diloco.discovery.patience import JITTER, keep_trying
from p2p_diloco.errors import BootstrapUnanswered, DiscoveryError, JoinStopped

pytestmark = pytest.mark.timeout(30)


class Unanswered:
    """An attempt that finds no bootstrap node `fails` times, then joins; it notes when it was made."""

    def __init__(self, fails: int) -> None:
        self.fails, self.at, self.time_left = fails, [], []

    def __call__(self, time_left):
        self.at.append(time.monotonic())
        self.time_left.append(time_left)
        if len(self.at) <= self.fails:
            raise BootstrapUnanswered(f"no bootstrap node answered (try {len(self.at)})")
        return "joined"


def test_it_tries_again_with_growing_jittered_pauses_and_says_so_once(caplog):
    attempt = Unanswered(fails=3)
    with caplog.at_level(logging.WARNING, logger="p2p_diloco.discovery.patience"):
        assert keep_trying(attempt, limit_s=None, stopped=lambda: False, first_pause_s=0.1,
                           rng=random.Random(0)) == "joined"
    pauses = [b - a for a, b in zip(attempt.at, attempt.at[1:])]
    assert len(pauses) == 3 and attempt.time_left == [None] * 4  # no limit: each attempt waits its own timeout
    for i, pause in enumerate(pauses):  # 0.1, 0.2, 0.4 s, each cut by up to JITTER
        assert 0.1 * 2 ** i * (1 - JITTER) - 0.01 <= pause <= 0.1 * 2 ** i + 0.05
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "try 1" in warnings[0] and "[discovery] join_timeout" in warnings[0]


def test_a_limit_ends_it_with_an_error_naming_the_limit_and_bounds_each_attempt():
    attempt = Unanswered(fails=1000)
    t0 = time.monotonic()
    with pytest.raises(BootstrapUnanswered, match=r"within the join timeout of 0.5 s \(\d+ tries; the last: no boot"):
        keep_trying(attempt, limit_s=0.5, stopped=lambda: False, first_pause_s=0.05)
    assert 0.5 <= time.monotonic() - t0 < 1.0
    assert all(0 < left <= 0.5 for left in attempt.time_left)  # an attempt never waits past the limit
    assert attempt.time_left == sorted(attempt.time_left, reverse=True)


def test_a_stop_ends_the_wait_and_other_errors_are_not_retried():
    attempt = Unanswered(fails=1000)
    asked = time.monotonic() + 0.3
    with pytest.raises(JoinStopped, match="stopped while waiting"):
        keep_trying(attempt, limit_s=None, stopped=lambda: time.monotonic() >= asked, first_pause_s=0.05)
    assert time.monotonic() - asked < 0.2

    def misconfigured(_time_left):
        misconfigured.calls += 1
        raise DiscoveryError("--discovery dht needs a DHT multiaddr")

    misconfigured.calls = 0
    with pytest.raises(DiscoveryError, match="needs a DHT multiaddr"):
        keep_trying(misconfigured, limit_s=None, stopped=lambda: False)
    assert misconfigured.calls == 1
