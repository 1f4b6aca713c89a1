"""Partner choice: who is a candidate, and how failures, load and staleness weigh."""

import random

import pytest
from p2p_diloco.peers.gossip.partners import MAX_BACKOFF_S, MIN_BACKOFF_S, PartnerChooser

from p2p_diloco.core.schedule import shifted_partner

from p2p_diloco.discovery.records import IslandRecord


def rec(pid, version=5, tokens=1000, state="training", upload_bps=0.0):
    return IslandRecord(peer_id=pid, endpoint=f"tcp://127.0.0.1:{9000 + len(pid)}", version=version, tokens=tokens,
                        state=state, upload_bps=upload_bps)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def chooser(**kw):
    return PartnerChooser("me", max_staleness=8, rng=random.Random(0), **kw)


def test_only_trained_live_fresh_enough_others_are_candidates():
    members = {"me": rec("me"), "a": rec("a"), "fresh-start": rec("fresh-start", version=0, tokens=0),
               "leaving": rec("leaving", state="leaving"), "far-behind": rec("far-behind", version=0, tokens=10)}
    assert set(chooser().candidates(members, own_version=9)) == {"a"}
    assert chooser().choose({"me": rec("me"), "x": rec("x", tokens=0)}, 0) is None  # nothing trained to learn from


def test_failed_partner_backs_off_and_doubles():
    clock = Clock()
    c = chooser(clock=clock)
    members = {"a": rec("a"), "b": rec("b")}
    c.failed("a")
    assert set(c.candidates(members, 5)) == {"b"}
    clock.t += MIN_BACKOFF_S + 0.01
    assert set(c.candidates(members, 5)) == {"a", "b"}
    c.failed("a")  # second failure in a row: twice the wait
    clock.t += MIN_BACKOFF_S + 0.01
    assert "a" not in c.candidates(members, 5)
    for _ in range(10):
        c.failed("a")
    assert c.history["a"].retry_after - clock.t == pytest.approx(MAX_BACKOFF_S)
    c.succeeded("a", 1000, 1.0)
    assert "a" in c.candidates(members, 5)


def test_loaded_stale_and_previous_partners_weigh_less():
    c = chooser()
    w = c.candidates({"idle": rec("idle"), "busy": rec("busy", upload_bps=3e6), "behind": rec("behind", version=3)}, 5)
    assert w["busy"] < w["idle"] and w["behind"] < w["idle"]
    picks = {c.choose({"a": rec("a", version=v), "b": rec("b", version=v)}, v).peer_id for v in range(20)}
    assert picks == {"a", "b"}  # the permutation moves on with the version: load spreads


def test_islands_at_one_version_fetch_from_distinct_partners_unless_one_is_much_slower():
    ids = ["a", "b", "c", "d"]
    for version in range(5, 15):
        members = {i: rec(i, version=version) for i in ids}
        picks = [PartnerChooser(i, max_staleness=8, rng=random.Random(0)).choose(members, version).peer_id for i in ids]
        assert sorted(picks) == ids and all(p != i for p, i in zip(picks, ids))  # a permutation: one fetch per upload
    c = chooser()
    members = {i: rec(i) for i in ("me", *ids)}
    shifted = c.choose(members, 7).peer_id
    for i in ids:
        c.succeeded(i, 1000 if i == shifted else 4000, 1.0)  # it is measured 4x slower than the others
    picks = [c.choose(members, 7).peer_id for _ in range(200)]
    assert picks.count(shifted) < 30 and len(set(picks)) == 4  # the weighted draw: its speed weight is 1/4


def test_min_version_keeps_only_members_that_reached_it():
    members = {"me": rec("me", version=5), "same": rec("same", version=5), "ahead": rec("ahead", version=6),
               "behind": rec("behind", version=4)}
    c = chooser()
    assert set(c.candidates(members, 5, min_version=5)) == {"same", "ahead"}
    assert set(c.candidates(members, 5)) == {"same", "ahead", "behind"}
    assert c.choose({"me": members["me"], "behind": members["behind"]}, 5, min_version=5) is None


def test_early_in_a_round_the_draw_skips_the_last_two_partners_while_others_live():
    members = {pid: rec(pid) for pid in ("me", "a", "b", "c", "d")}
    c = chooser()
    shifted = c.choose(members, 5, min_version=5, skip_recent=True).peer_id  # this version's permutation partner
    assert shifted == shifted_partner(list(members), "me", 5)
    c.failed(shifted)  # in backoff: the weighted draw decides, sparing the last two partners
    picks = [c.choose(members, 5, min_version=5, skip_recent=True).peer_id for _ in range(9)]
    assert shifted not in picks and all(len(set(picks[k:k + 3])) == 3 for k in range(7)), picks  # in turn
    members = {pid: rec(pid) for pid in ("me", "a", "b")} | {"c": rec("c", version=4)}  # c lacks our version
    c = chooser()
    c.recent.extend(["a", "b"])
    got, expect = c.choose(members, 5, min_version=5, skip_recent=True), shifted_partner(list(members), "me", 5)
    assert (got and got.peer_id) == (expect if expect in ("a", "b") else None)  # the draw spares a and b
    assert c.choose(members, 5, min_version=0).peer_id in {"a", "b", "c"}  # later in the round: anyone
    alone = chooser()
    pair = {"me": rec("me"), "a": rec("a")}
    assert [alone.choose(pair, 5, min_version=5, skip_recent=True).peer_id for _ in range(3)] == ["a"] * 3


def test_a_partner_waited_for_may_not_have_trained_yet_when_it_is_the_permutation_partner():
    members = {pid: rec(pid, version=0, tokens=0) for pid in ("a", "b", "c")} | {"me": rec("me", version=1)}
    c = chooser()
    assert c.choose(members, 1) is None  # nobody trained: nothing to fetch now
    assert c.choose(members, 1, min_version=0, waits=True).peer_id == shifted_partner(list(members), "me", 1)


def test_a_member_running_another_model_is_never_chosen_and_logged_once(caplog):
    c = chooser(model="a" * 16)
    members = {"same": rec("same").replace(model="a" * 16), "other": rec("other").replace(model="b" * 16),
               "unknown": rec("unknown")}
    for _ in range(3):
        assert set(c.candidates(members, 5)) == {"same", "unknown"}
    assert sum("runs another model" in r.message for r in caplog.records) == 1


def test_an_outbound_only_member_is_a_candidate_only_through_a_relay():
    members = {"a": rec("a"), "natted": rec("natted").replace(reach="outbound")}
    assert set(chooser().candidates(members, 5)) == {"a"}  # nobody can dial it: its pushes reach us instead
    assert set(chooser(relay=True).candidates(members, 5)) == {"a", "natted"}


def test_in_a_ring_an_island_fetches_its_successor_while_it_stays_a_candidate():
    clock = Clock()
    c = PartnerChooser("b", max_staleness=8, rng=random.Random(0), ring=True, clock=clock)
    members = {pid: rec(pid) for pid in ("a", "b", "c", "d")}
    assert {c.choose(members, 5).peer_id for _ in range(10)} == {"c"}  # the same one, round after round
    assert c.choose(members, 5, min_version=7, skip_recent=True).peer_id == "c"  # early in a round too
    c.failed("c")
    assert c.choose(members, 5).peer_id == "d"  # while it is backed off, the next one
    last = PartnerChooser("d", ring=True)
    assert last.choose(members, 5).peer_id == "a"  # the ring wraps around


def test_a_member_its_record_holds_is_drawn_that_much_less_and_never_the_permutation_partner():
    members = {p: rec(p) for p in ("me", "a", "b", "c")}
    held = {"b": 0.1}
    c = chooser(share=lambda peer, members: held.get(peer, 1.0))
    weights = c.candidates(members, own_version=5)
    assert weights["b"] == pytest.approx(0.1 * weights["a"])
    for version in range(40):  # whichever version makes "b" the permutation partner, the draw decides
        if shifted_partner(list(members), "me", version) == "b":
            picks = [PartnerChooser("me", rng=random.Random(i), share=lambda peer, members: held.get(peer, 1.0))
                     .choose(members, version).peer_id for i in range(50)]
            assert picks.count("b") < 10
            break
    else:
        pytest.fail("no version made b the permutation partner")
