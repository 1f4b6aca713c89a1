"""`core.linkfit`: what `--exchange auto` fetches, from the measured link, the same for the island and
the simulator."""

import math

import pytest

from p2p_diloco.core.linkfit import PROBE_SHARE, RATE_MEMORY, STATE_BELOW, UPDATES_ABOVE, LinkFit


def test_whole_states_until_one_does_not_fit_said_once():
    fit = LinkFit()
    first, changed = fit.choose(1_000_000, round_s=5.0)
    assert not first.updates and first.ratio is None and changed and "no link measured" in first.reason
    fit.measured("a", 125e6)  # 1 Gbit/s: a 1 MB state moves in 8 ms, 0.0016 rounds
    fast, changed = fit.choose(1_000_000, round_s=5.0)
    assert not fast.updates and not changed and fast.ratio == pytest.approx(0.0016)
    assert str(fast).startswith("state: a whole state (1.00 MB) takes 0.002 rounds to move at 1000.00 Mbit/s")
    fit.measured("a", 0.5e6 / 8)  # 0.5 Mbit/s: 16 s, 3.2 rounds
    slow, changed = fit.choose(1_000_000, round_s=5.0)
    assert slow.updates and changed and str(slow).startswith("updates: a whole state (1.00 MB) takes 3.200 rounds")
    assert fit.choose(1_000_000, round_s=5.0) == (slow, False)  # said once


def test_the_choice_changes_with_the_link_with_hysteresis():
    fit, state_bytes, round_s = LinkFit(), 1_000_000, 4.0
    rate = lambda share: state_bytes / (share * round_s)  # noqa: E731 - the rate at which a state takes `share` rounds
    fit.measured("a", rate(STATE_BELOW / 2))
    assert not fit.choose(state_bytes, round_s)[0].updates
    fit.measured("a", rate((STATE_BELOW + UPDATES_ABOVE) / 2))  # between the thresholds: no change
    assert fit.choose(state_bytes, round_s) == (fit.fit, False) and not fit.fit.updates
    fit.measured("a", rate(UPDATES_ABOVE * 1.2))
    slow, changed = fit.choose(state_bytes, round_s)
    assert slow.updates and changed and slow.ratio == pytest.approx(UPDATES_ABOVE * 1.2)
    fit.measured("a", rate((STATE_BELOW + UPDATES_ABOVE) / 2))  # back between them: updates stay
    assert fit.choose(state_bytes, round_s)[0].updates
    fit.measured("a", rate(STATE_BELOW * 0.9))
    assert fit.choose(state_bytes, round_s) == (fit.fit, True) and not fit.fit.updates


def test_a_whole_state_that_will_not_fit_gives_way_after_the_probe():
    state, round_s = 1_000_000, 4.0
    probe, slow, fast = PROBE_SHARE * round_s, state / round_s, 100 * state / round_s  # 1 round, 0.01 round
    assert not LinkFit.give_way(probe / 2, slow, 1000, state, round_s)  # too early to judge
    assert not LinkFit.give_way(probe, math.nan, 1000, state, round_s)  # one chunk: no rate yet
    assert LinkFit.give_way(probe, slow, int(slow * probe), state, round_s)  # the rest: 0.95 rounds
    assert not LinkFit.give_way(probe, slow, int(state * 0.9), state, round_s)  # the rest: 0.1 rounds
    assert not LinkFit.give_way(probe, fast, 1000, state, round_s)
    assert not LinkFit.give_way(probe, slow, 1000, state, 0.0)  # no round measured yet


def test_the_slowest_partner_measured_lately_decides():
    """A member behind a slow uplink puts every island that measured it on updates (fixed `sign` updates
    won there, BENCHMARKS.md "A heterogeneous swarm"), for `RATE_MEMORY` choices after it was measured."""
    fit = LinkFit()
    for peer, rate in (("a", 1e8), ("b", 1e8), ("c", 0.5e6 / 8)):
        fit.measured(peer, rate)
    assert fit.rate() == 0.5e6 / 8 and fit.choose(1_000_000, 5.0)[0].updates
    assert "the slowest partner's" in fit.fit.reason
    fit.measured("d", 0.0)  # a fetch that moved nothing measures nothing
    assert fit.rate() == 0.5e6 / 8
    for _ in range(RATE_MEMORY - 1):
        fit.measured("a", 1e8)  # fetches from a fast partner; the slow one not met again
        assert fit.choose(1_000_000, 5.0)[0].updates
    fit.measured("a", 1e8)
    fit_now, changed = fit.choose(1_000_000, 5.0)
    assert fit.rate() == 1e8 and not fit_now.updates and changed  # its rate is too old to count
    for _ in range(RATE_MEMORY):
        fit.choose(1_000_000, 5.0)
    assert fit.rate() is None and "no link measured lately" in fit.choose(1_000_000, 5.0)[0].reason


def test_an_islands_fetch_choice_gives_way_once_and_says_what_it_fetches(caplog):
    """`peers.gossip.fetchchoice.FetchChoice`: a fixed exchange asks the same every time; `auto` starts with
    whole states, gives a slow one up once (measuring its rate), then asks for updates, said once."""
    import logging

    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import FetchChoice

    fixed = FetchChoice(exchange_mode("updates", "sign"), "i", "me")
    assert fixed.next(1_000_000, 4.0) == (True, None) and fixed.describe() == ""
    assert not fixed.give_way((1.0, 10, 1.0, 1.0), 1_000_000, 4.0)
    auto, state, round_s = FetchChoice(exchange_mode("auto", "sign"), "i", "me"), 1_000_000, 4.0
    assert auto.next(state, round_s) == (True, True) and auto.describe() == ""  # the first contact: updates
    auto.started("q", True)
    auto.landed("q", 1e9, 10_000)  # too small to measure a link (10 us of data): it measures nothing
    assert auto.next(state, round_s) == (False, False) and auto.describe().startswith("state: no link measured")
    assert auto.fit.rate() is None and auto.measured_last == (None, 0.0)
    auto.started("p", False)
    slow = (1.0, 25_000, 1.0, 25_000.0)  # 25 kB/s: the rest takes 39 s, ~10 rounds
    caplog.clear()  # (what was said before, where an earlier test left the logger at INFO)
    with caplog.at_level(logging.INFO, logger="p2p_diloco.peers.gossip.fetchchoice"):
        assert auto.give_way(slow, state, round_s) and not auto.give_way(slow, state, round_s)  # judged once
        assert auto.next(state, round_s) == (True, True) and auto.next(state, round_s) == (True, True)
    said = [r.getMessage() for r in caplog.records if "fetches" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("i fetches public-state updates now: a whole state (1.00 MB) takes 10.000")
    assert auto.describe().startswith("updates: a whole state (1.00 MB) takes 10.000 rounds")


def test_a_first_contact_that_took_as_long_as_a_probe_measures_a_slow_link_and_spares_the_probe(caplog):
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import FetchChoice

    auto, state, round_s = FetchChoice(exchange_mode("auto", "sign"), "i", "me"), 1_000_000, 4.0
    assert auto.next(state, 0.0) == (True, True)  # in the first round: no round's length known yet
    auto.started("p", True)
    auto.landed("p", 10_000.0, 8_000)  # 0.8 s of data at 0.08 Mbit/s: a fifth of a round, once one is known
    assert auto.next(state, 0.0) == (True, True) and auto.measured_last == (None, 0.0)  # not judged yet
    with caplog.at_level("WARNING"):  # the first choice, of a slow link: said as a change is
        assert auto.next(state, round_s) == (True, True) and auto.measured_last == ("p", 10_000.0)
    assert [r.message[:37] for r in caplog.records] == ["i fetches public-state updates now: a"]
    assert auto.describe().startswith("updates: a whole state (1.00 MB) takes 25.000 rounds")
    fixed = FetchChoice(exchange_mode("state", "sign"), "i", "me")
    assert fixed.next(state, round_s) == (True, None)  # (a fixed exchange has no first contact to make)
    joiner = FetchChoice(exchange_mode("auto", "sign"), "i", "me", at_start=lambda: False)
    assert joiner.next(state, round_s) == (False, False)  # past a run's start, or a joiner: a whole state probes


def test_on_updates_an_island_asks_for_a_whole_state_now_and_then_and_goes_back_if_it_fits(caplog):
    """`REPROBE_EVERY`: an update fetch is too small to measure a link, so a rate measured once while a
    partner was starved of CPU would keep an island on updates; every so many fetches one asks for the
    whole state again (silently); when it lands at a fast rate, the island goes back to whole states."""
    import logging

    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import REPROBE_EVERY, FetchChoice

    auto, state, round_s = FetchChoice(exchange_mode("auto", "sign"), "i", "me"), 1_000_000, 4.0
    auto.landed("p", 25_000.0, state)  # a slow rate: updates
    asked = []
    for _ in range(2 * REPROBE_EVERY + 2):
        asked.append(auto.next(state, round_s))
        auto.started("p", asked[-1][0])
        if not asked[-1][0]:  # the whole state asked for now and then gives way on the slow link again
            assert auto.give_way((1.0, 25_000, 1.0, 25_000.0), state, round_s)
    assert asked.count((False, True)) == 2 and asked[REPROBE_EVERY] == (False, True)  # from the ring partner
    assert all(a == (True, True) for k, a in enumerate(asked) if k not in (REPROBE_EVERY, 2 * REPROBE_EVERY + 1))
    caplog.clear()  # (what was said before, where an earlier test left the logger at INFO)
    with caplog.at_level(logging.INFO, logger="p2p_diloco.peers.gossip.fetchchoice"):
        auto.started("p", False)
        auto.landed("p", 1e9, state)  # the probe landed at loopback's rate
        assert auto.next(state, round_s) == (False, False)
    said = [r.getMessage() for r in caplog.records if "fetches" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("i fetches whole states now")


def test_an_update_that_took_as_long_as_a_probe_measured_the_link_and_spares_the_probe():
    """On a slow link each update's chunks measure it: a probe there would only cost a round its mix."""
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import REPROBE_EVERY, FetchChoice

    auto, state, round_s = FetchChoice(exchange_mode("auto", "sign"), "i", "me"), 1_000_000, 4.0
    auto.landed("p", 25_000.0, state)
    asked = []
    for _ in range(2 * REPROBE_EVERY + 2):
        asked.append(auto.next(state, round_s))
        auto.started("p", asked[-1][0])
        auto.landed("p", 25_000.0, 100_000)  # 4 s of data, a round: as good a measurement as a probe
    assert all(a == (True, True) for a in asked)
    assert not auto.waits(True) and auto.waits(False)  # (on updates it does not wait for a partner's version)


def test_only_the_first_whole_state_of_auto_skips_the_wait_for_a_partners_version():
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import FetchChoice

    auto = FetchChoice(exchange_mode("auto", "sign"), "i", "me")
    assert not auto.waits(False)  # no rate yet: a probe, whose updates follow in the same round
    auto.landed("p", 1e9, 1_000_000)
    assert auto.waits(False) and not auto.waits(True)
    fixed = FetchChoice(exchange_mode("updates", "sign"), "i", "me")
    assert fixed.waits(True) and fixed.waits(False)


def test_a_rate_too_old_to_count_does_not_make_a_whole_state_a_probe():
    """On loopback a whole state comes in one chunk once the link is measured, so no later fetch measures
    it again: the rate ages out of `RATE_MEMORY`, but the island still waits for its partner's version."""
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.peers.gossip.fetchchoice import FetchChoice

    auto = FetchChoice(exchange_mode("auto", "sign"), "i", "me")
    auto.landed("p", 1e9, 1_000_000)
    for _ in range(RATE_MEMORY + 1):
        assert auto.next(1_000_000, 4.0) == (False, False)
    assert auto.fit.rate() is None and auto.waits(False)


def test_updates_go_in_as_few_fragments_as_fit_the_link_with_hysteresis():
    from p2p_diloco.core.linkfit import FEWER_BELOW, FRAGMENT_SHARE, FRAGMENTS_ABOVE

    fit, update, round_s = LinkFit(), 100_000, 4.0
    rate = lambda share: update / (share * FRAGMENT_SHARE * round_s)  # noqa: E731 - an update takes `share` x the bound
    assert fit.parts(update, round_s, 16) == (16, "")  # before any rate: small, and nothing to say
    fit.heard("a", update / (0.9 * FRAGMENTS_ABOVE * round_s))  # a whole update fits: no fragments
    assert fit.parts(update, round_s, 16)[0] == 1
    fit.heard("a", rate(6))  # 4 fragments would take 1.5x the bound, 8 take 0.75x
    parts, why = fit.parts(update, round_s, 16)
    assert parts == 8 and why.startswith(f"an update (100 kB) takes {6 * FRAGMENT_SHARE:.2f} rounds to move")
    fit.heard("a", rate(3.8))  # 4 would fit (0.95x), but not with the margin: 8 stay
    assert 3.8 / 4 > FEWER_BELOW and fit.parts(update, round_s, 16)[0] == 8
    fit.heard("a", rate(2.6))  # 4 fit well now (0.65x)
    assert fit.parts(update, round_s, 16)[0] == 4
    fit.heard("a", rate(6))
    assert fit.parts(update, round_s, 2)[0] == 2  # no more than the exchange allows
    fit.heard("a", update / (0.4 * round_s))  # a whole update in 0.4 rounds: over the margin, fragments stay
    assert fit.parts(update, round_s, 16)[0] == 4
    fit.heard("a", update / (0.3 * round_s))  # under it: whole updates again
    assert fit.parts(update, round_s, 16)[0] == 1
    fit.heard("a", update / (0.45 * round_s))  # under FRAGMENTS_ABOVE: whole updates fit
    assert fit.parts(update, round_s, 16)[0] == 1
    for _ in range(RATE_MEMORY):  # nothing heard lately: the last choice stays, unsaid
        fit.choose(1_000_000, round_s)
    assert fit.uplink_rate() is None and fit.parts(update, round_s, 16) == (1, "")


def test_fragments_follow_the_islands_own_uplink_not_the_partners_it_fetched_from():
    """Two fast islands that once fetched from a slow one send each other whole updates: the
    fragments follow what the partners measured of this island's uplink (`heard`)."""
    fit, update, round_s = LinkFit(), 100_000, 4.0
    fit.measured("slow", update / (8 * round_s))  # its fetches from a slow partner: an update in 8 rounds
    assert fit.parts(update, round_s, 16) == (16, "")  # not what decides; nothing heard yet
    fit.heard("fast", 1e8)  # a partner fetched from this island at 800 Mbit/s
    assert fit.parts(update, round_s, 16)[0] == 1
    fit.heard("slow", update / (8 * round_s))  # the slow partner fetches from it slowly (its downlink)
    assert fit.parts(update, round_s, 16)[0] == 16


def test_an_island_says_once_when_its_updates_go_in_fragments(caplog):
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.peers.gossip.fetchchoice import FetchChoice

    fixed = FetchChoice(exchange_mode("fragments", "sign", 4), "i", "me")
    assert fixed.parts(100_000, {}) == 4
    assert FetchChoice(exchange_mode("updates", "sign"), "i", "me").parts(100_000, {}) == 1
    auto = FetchChoice(exchange_mode("auto", "sign"), "i", "me")
    with caplog.at_level("WARNING"):
        assert auto.parts(100_000, {}) == 16 and not caplog.records and auto.describe() == ""
    auto.landed("p", 100_000 / 8.0, 1_000_000)  # its own fetch from p: p's record will say it, not this one's
    assert auto.measured_last == ("p", 100_000 / 8.0)
    auto.next(1_000_000, 4.0)

    def record(peer: str, frm: str, bps: float) -> IslandRecord:
        return IslandRecord(peer_id=peer, endpoint="tcp://127.0.0.1:1", fetched_from=frm, fetched_bps=bps)

    members = {"me": record("me", "p", 100_000 / 8.0), "q": record("q", "me", 100_000 / 8.0),  # q: an update takes 8 s
               "r": record("r", "p", 1.0)}
    with caplog.at_level("WARNING"):
        assert auto.parts(100_000, members) == 16 and auto.parts(100_000, members) == 16
    said = [r.message for r in caplog.records if "sends its updates in" in r.message]
    assert said == ["i sends its updates in 16 fragments now: an update (100 kB) takes 2.00 rounds to move at "
                    "0.10 Mbit/s, as its partners measured its uplink (fragments above 0.5, each under 0.15)"]
    assert auto.describe().endswith("; sends updates in 16 fragments")
