"""An island that mixes nothing while others train says so once, with why, and when it mixes again."""

from __future__ import annotations

import logging

from p2p_diloco.discovery.records import MAX_ALONE_CHARS, IslandRecord
from p2p_diloco.peers.rounds.alone import ALONE_ROUNDS, SURE_ROUNDS, AloneWatch, Link

SLOW = Link(rate_bps=0.5e6 / 8, state_bytes=1_280_000, round_s=1.0)  # 0.5 Mbit/s, the tiny model's state


def test_rounds_without_a_mix_among_others_are_said_once_with_the_rate_and_the_cause(caplog):
    watch = AloneWatch("island-a")
    caplog.set_level(logging.INFO, logger="p2p_diloco.peers.rounds.alone")
    said = []
    for r in range(3 * ALONE_ROUNDS):
        if r % 4 == 0:
            watch.arrived_stale(lag=20)
        watch.fetch_failed("TransportTimeout: no answer from tcp://127.0.0.1:1 for 10 s") if r == 5 else None
        said.append(watch.end_round(others=3, link=SLOW, max_staleness=8, now=1.2 * r))  # rounds of 1.2 s
    reasons = [s for s in said if s is not None]
    assert len(reasons) == 1 and said[ALONE_ROUNDS - 1] == reasons[0]  # at the 10th round, then not again
    why = watch.reason
    assert why == reasons[0] and len(why) <= MAX_ALONE_CHARS
    for part in ("no partner state mixed in 10 rounds while 3 others train", "0.50 Mbit/s measured",
                 "1.28 MB state takes 20 s, 20 rounds", "--exchange updates", "3 arrived too stale (up to 20 versions, bound 8)",
                 "1 fetches failed (last: TransportTimeout: no answer"):
        assert part in why, (part, why)
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "island-a trains alone" in caplog.text
    IslandRecord(peer_id="a", endpoint="tcp://127.0.0.1:1", alone=why)  # a record carries it

    watch.mixed()  # a mix ends it, with one line
    assert watch.reason is None and "mixes a partner's state again, after 30 rounds alone" in caplog.text
    assert watch.end_round(others=3, link=SLOW, max_staleness=8, now=100.0) is None and watch.unmixed_rounds == 0
    assert watch.episodes == 1


def test_a_lone_island_or_one_that_mixes_says_nothing():
    watch = AloneWatch("b")
    for r in range(3 * ALONE_ROUNDS):
        assert watch.end_round(others=0, link=SLOW, max_staleness=8, now=r) is None  # nobody else: not news
    for r in range(3 * ALONE_ROUNDS):
        watch.mixed()
        assert watch.end_round(others=2, link=SLOW, max_staleness=8, now=r) is None
    assert watch.reason is None and watch.episodes == 0


def test_failures_without_a_measured_rate_are_the_reason():
    watch = AloneWatch("c", rounds=2)
    watch.fetch_failed("ConnectionLost: tcp://127.0.0.1:9 closed the connection mid-exchange")
    watch.end_round(others=1, link=Link(None, 1000, 1.0), max_staleness=8, now=0.0)
    why = watch.end_round(others=1, link=Link(None, 1000, 1.0), max_staleness=8, now=20.0)
    assert why == ("no partner state mixed in 2 rounds while 1 other train; 1 fetches failed "
                   "(last: ConnectionLost: tcp://127.0.0.1:9 closed the connection mid-exchange)")


def test_short_rounds_are_not_alone_before_discovery_could_show_a_partner():
    watch = AloneWatch("d")
    said = [watch.end_round(others=1, link=SLOW, max_staleness=8, now=0.1 * r) for r in range(150)]
    assert [r for r, s in enumerate(said) if s] == [100]  # 10 s of rounds of 0.1 s, not 10 rounds (1 s)


def test_an_island_that_sends_updates_already_is_told_what_else_would_fit():
    watch = AloneWatch("e", rounds=1, min_s=0.0)
    watch.exchanged()  # (the fetch that measured the link)
    why = watch.end_round(others=1, link=Link(1e4, 1_280_000, 1.0, updates=True), max_staleness=8, now=0.0)
    assert "longer rounds (-H) would fit it" in why and "--exchange updates" not in why


def rounds_until_said(watch: AloneWatch, before_each=lambda r: None, others: int = 1, n: int = 20) -> list[int]:
    """The rounds (of 5 s each) at whose end `watch` said it trains alone."""
    said = []
    for r in range(n):
        before_each(r)
        if watch.end_round(others=others, link=Link(None, 1000, 5.0), max_staleness=8, now=5.0 * r) is not None:
            said.append(r)
    return said


def test_states_of_another_run_are_the_reason_after_three_rounds(caplog):
    caplog.set_level(logging.WARNING, logger="p2p_diloco.peers.rounds.alone")
    watch = AloneWatch("island-0")
    why = ("snapshot from tcp://127.0.0.1:5 is for another run (initial weights 1234, this island's abcd): "
           "islands of one run start from the same weights")
    # refused once, then never chosen again: later rounds exchange nothing
    said = rounds_until_said(watch, lambda r: watch.refused("island-1", why, "run") if r == 0 else None)
    assert said == [SURE_ROUNDS - 1]  # the 3rd round (10 s in), not the 10th
    assert watch.reason.startswith("another run's weights: the states of island-1 were refused as another run's")
    assert "torch.manual_seed before building it" in watch.reason and len(watch.reason) <= MAX_ALONE_CHARS
    assert caplog.text.count("trains alone") == 1
    IslandRecord(peer_id="a", endpoint="tcp://127.0.0.1:1", alone=watch.reason)


def test_every_partner_refused_names_them_and_the_last_reason():
    watch = AloneWatch("x")
    said = rounds_until_said(watch, lambda r: watch.refused(f"p{r % 2}", f"implausible distance {r}"))
    assert said == [2]
    assert watch.reason.startswith("every partner refused: the states of p1, p0 were refused, nothing mixed in 3 rounds")
    assert watch.reason.endswith("(last: implausible distance 2)")


def test_an_outbound_island_that_finds_nobody_to_dial_says_so():
    watch = AloneWatch("o", outbound=True, relay=False)
    assert rounds_until_said(watch, others=2) == [2]
    assert watch.reason.startswith("nobody reachable: no exchange in 3 rounds while 2 others train; this island is "
                                   "outbound-only") and "bootstrap --relay" in watch.reason
    direct = AloneWatch("d")
    rounds_until_said(direct)
    assert "none could be fetched from" in direct.reason


def test_refusals_then_a_mix_end_the_episode_and_start_counting_afresh():
    watch = AloneWatch("y")
    rounds_until_said(watch, lambda r: watch.refused("p", "too far"), n=3)
    assert watch.reason is not None and watch.episodes == 1
    watch.mixed()  # (in round 0 below)
    assert watch.reason is None and not watch.refusals
    # then a fetch that runs on without landing: no certain cause, the 10 rounds apply again
    said = rounds_until_said(watch, lambda r: watch.exchanged() if r == 1 else None, n=ALONE_ROUNDS + 1)
    assert said == [ALONE_ROUNDS] and watch.reason.startswith("no partner state mixed in 10 rounds")


def test_an_island_without_a_bootstrap_address_says_at_once_it_trains_alone(caplog):
    caplog.set_level(logging.WARNING, logger="p2p_diloco.peers.rounds.alone")
    watch = AloneWatch("lone", bootstrap=False)
    assert watch.reason.startswith("no bootstrap: ") and watch.episodes == 1
    assert "lone trains alone: no bootstrap" in caplog.text
    assert rounds_until_said(watch, others=0) == [] and watch.reason.startswith("no bootstrap")  # said once, kept
    watch.mixed()  # an island that found it anyway ends it
    assert watch.reason is None


def test_on_a_link_too_slow_for_a_state_refusals_are_the_links_doing():
    watch = AloneWatch("z", rounds=1, min_s=0.0)
    watch.refused("p", "implausible size: its weights' norm is 0.426 x this island's")
    why = watch.end_round(others=1, link=SLOW, max_staleness=8, now=0.0)
    assert why.startswith("no partner state mixed in 1 rounds while 1 other train; 0.50 Mbit/s measured")
    assert why.endswith("states of p refused (last: implausible size: its weights' norm is 0.426 x this island's)")
