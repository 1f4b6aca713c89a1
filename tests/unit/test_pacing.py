"""Round pacing: an island that runs ahead of most others trains on until its round ends with theirs."""

import pytest
from p2p_diloco.peers.rounds.pacing import catch_up_seconds, phase_offset

from p2p_diloco.discovery.records import IslandRecord

NOW = 1.7e9
ROUND = 5.0  # this island published ROUND seconds ago: its round's H steps took that long
FRESH_S = 6.0  # records older than this do not count


def rec(pid, published_ago, state="training", announced_ago=1.0):
    return IslandRecord(peer_id=pid, endpoint="tcp://127.0.0.1:9000", state=state, published_at=NOW - published_ago,
                        timestamp=NOW - announced_ago)


def catch_up(*others):
    members = {"me": rec("me", ROUND), **{r.peer_id: r for r in others}}
    return catch_up_seconds(members, "me", NOW - ROUND, NOW, FRESH_S)


def test_phase_offset_wraps_into_half_a_period_either_side():
    assert phase_offset(12.0, 10.0, 5.0) == pytest.approx(2.0)  # publishes 2 s after us: behind
    assert phase_offset(14.0, 10.0, 5.0) == pytest.approx(-1.0)  # 4 s after is 1 s before our next
    assert phase_offset(9.0, 10.0, 5.0) == pytest.approx(-1.0)
    assert phase_offset(10.0, 10.0, 5.0) == 0.0


def test_islands_in_step_do_not_stretch():
    # the others published just now or a moment ago, as this island is about to
    assert catch_up(rec("a", 0.1), rec("b", 0.3), rec("c", ROUND + 0.2)) == 0.0


def test_island_ahead_of_most_trains_on_until_the_median_catches_up():
    # a and b published 2 s and 1.5 s after this island's last publish: they end their rounds that much later
    assert catch_up(rec("a", ROUND - 2.0), rec("b", ROUND - 1.5), rec("c", 0.2)) == pytest.approx(1.5)


def test_one_slow_island_is_outvoted():
    # c is far behind (a straggler); a and b are in step: no stretch for the straggler's sake
    assert catch_up(rec("a", 0.1), rec("b", 0.2), rec("c", ROUND - 2.4)) == 0.0
    # with two others, both must be behind (lower median)
    assert catch_up(rec("a", 0.1), rec("c", ROUND - 2.4)) == 0.0
    assert catch_up(rec("a", ROUND - 1.0), rec("c", ROUND - 2.4)) == pytest.approx(1.0)


def test_only_live_training_islands_with_fresh_records_count():
    behind = ROUND - 2.0
    assert catch_up(rec("gone", behind, announced_ago=FRESH_S + 1)) == 0.0  # a dead island's lingering record
    assert catch_up(rec("leaving", behind, state="leaving")) == 0.0
    assert catch_up(rec("new", 0.0).replace(published_at=0.0)) == 0.0  # has not published yet
    assert catch_up(rec("a", behind)) == pytest.approx(2.0)
    assert catch_up() == 0.0  # alone


def test_no_stretch_before_the_first_publish():
    members = {"a": rec("a", ROUND - 2.0)}
    assert catch_up_seconds(members, "me", 0.0, NOW, FRESH_S) == 0.0
