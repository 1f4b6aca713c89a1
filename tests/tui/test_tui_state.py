"""The dashboard's state layer, fed real `IslandRecord` sequences (no widgets, no network)."""

from __future__ import annotations

import pytest
from p2p_diloco.tui.source import ReplaySource, Snapshot
from p2p_diloco.tui.state import HISTORY, SwarmState
from timeline import EXPIRY, IDS, T0, frame, record, timeline


def snap(t: float, records, status: str = "connected", detail: str = "") -> Snapshot:
    return Snapshot(t, None if records is None else {r.peer_id: r for r in records}, status, detail, "zmq")


def fed(frames: int, **options) -> SwarmState:
    state = SwarmState(expiry=EXPIRY, **options)
    for t, records in timeline(frames):
        state.ingest(snap(t, records))
    return state


def kinds(events, peer: str | None = None) -> list[str]:
    return [e.kind for e in events if peer is None or e.peer_id == IDS[peer]]


def test_versions_behind_the_freshest_and_their_levels():
    state = fed(21)  # at +20 s: a v40, b v39, c v38, d v21
    behind = {name: state.islands[IDS[name]].behind for name in "abcd"}
    assert behind == {"a": 0, "b": 1, "c": 2, "d": 19}
    levels = {name: state.behind_level(state.islands[IDS[name]]) for name in "abcd"}
    assert levels == {"a": 0, "b": 0, "c": 0, "d": 2}
    d = state.islands[IDS["d"]]
    d.behind = 5  # more than half of max staleness 8
    assert state.behind_level(d) == 1


@pytest.mark.parametrize("age, level", [(0.0, 0), (15.0, 0), (15.5, 1), (30.0, 1), (30.5, 2)])
def test_record_age_is_measured_from_the_island_timestamp(age, level):
    state = SwarmState(stale_after=15.0)
    state.ingest(snap(T0 + 100, [record("a", T0 + 100 - age, version=3)]))
    view = state.islands[IDS["a"]]
    assert view.age == pytest.approx(age)
    assert state.age_level(view) == level


def test_islands_present_at_the_first_look_are_in_the_swarm_later_ones_joined():
    state = SwarmState(expiry=EXPIRY)
    first = state.ingest(snap(T0, frame(0)[1]))
    assert kinds(first) == ["connected"] + ["join"] * 4
    assert all("in the swarm" in e.text for e in first[1:])
    for t, records in timeline(51)[1:]:
        state.ingest(snap(t, records))
    joined = [e for e in state.events_of(IDS["e"]) if e.kind == "join"]
    assert len(joined) == 1 and "joined at 127.0.0.1:20004" in joined[0].text and joined[0].t == T0 + 50


def test_clean_exit_counts_as_left_and_a_silent_vanish_as_expired():
    state = fed(60)
    assert kinds(state.events, "c") == ["join", "leaving", "left"]
    left = state.events_of(IDS["c"])[-1]
    assert left.t == T0 + 41
    assert state.islands[IDS["c"]].gone == "left"

    expired = [e for e in state.events_of(IDS["b"]) if e.kind == "expired"]
    assert len(expired) == 1 and expired[0].t == T0 + 30 + EXPIRY
    assert "silent 11s" in expired[0].text  # its record last changed at +29 s
    assert state.islands[IDS["b"]].gone == "expired"
    assert state.islands[IDS["b"]].shown_state == "expired"


def test_a_record_withdrawn_while_still_changing_counts_as_left():
    state = SwarmState(expiry=30.0)
    state.ingest(snap(T0, [record("a", T0, version=1), record("b", T0, version=1)]))
    state.ingest(snap(T0 + 1, [record("a", T0 + 1, version=2), record("b", T0 + 1, version=2)]))
    events = state.ingest(snap(T0 + 2, [record("a", T0 + 2, version=3)]))
    assert [(e.kind, e.peer_id) for e in events] == [("left", IDS["b"])]


def test_falling_behind_and_catching_up_are_logged_once_each():
    state = fed(60)
    d_events = kinds(state.events, "d")
    assert d_events.count("behind") == 1 and "caught-up" not in d_events
    behind = next(e for e in state.events_of(IDS["d"]) if e.kind == "behind")
    assert "fell 9 versions behind" in behind.text
    # d mixes with a fresh partner and jumps to the freshest version
    t = T0 + 60
    records = [r if r.peer_id != IDS["d"] else r.replace(version=79, timestamp=t) for r in frame(59)[1]]
    events = state.ingest(snap(t, records))
    assert [(e.kind, e.peer_id) for e in events] == [("caught-up", IDS["d"])]
    assert state.islands[IDS["d"]].behind == 0


def test_swarm_totals():
    state = fed(60)  # at +59 s: a v79, d v34, e v79 live; b expired, c left
    t = state.totals()
    assert (t.live, t.seen) == (3, 5)
    assert t.tokens_per_s == 3100.0 + 1000.0 + 3050.0
    live_losses = [state.islands[IDS[n]].record.loss for n in "ade"]
    assert t.best_loss == min(live_losses)
    assert t.mean_loss == pytest.approx(sum(live_losses) / 3)
    assert t.freshest_version == 79
    assert t.run_seconds == 59 + 120  # a started two minutes before T0
    sent = sum(v.record.bytes_sent for v in state.islands.values())
    assert t.bytes_moved == sent == (79 + 48 + 58 + 34 + 79) * 3_000_000


def test_gone_islands_are_dropped_after_linger_but_their_bytes_still_count():
    state = fed(60, linger=5.0)
    assert IDS["c"] not in state.islands and IDS["b"] not in state.islands  # gone at +41 s and +40 s
    assert state.totals().bytes_moved == (79 + 48 + 58 + 34 + 79) * 3_000_000
    assert state.totals().seen == 3


def test_disconnection_keeps_the_islands_and_is_logged():
    state = fed(10)
    before = {pid: v.record for pid, v in state.islands.items()}
    events = state.ingest(snap(T0 + 100, None, "disconnected", "no rendezvous answered"))
    assert [e.kind for e in events] == ["disconnected"] and "no rendezvous answered" in events[0].text
    assert state.status == "disconnected"
    assert {pid: v.record for pid, v in state.islands.items()} == before
    assert all(v.live for v in state.islands.values())
    assert state.ingest(snap(T0 + 101, None, "disconnected", "no rendezvous answered")) == []  # not repeated
    back = state.ingest(snap(T0 + 102, frame(10)[1]))
    assert [e.kind for e in back] == ["connected"]


def test_an_island_that_comes_back_is_a_rejoin():
    state = SwarmState(expiry=10.0)
    state.ingest(snap(T0, [record("a", T0, version=1), record("b", T0, version=1)]))
    state.ingest(snap(T0 + 20, [record("a", T0 + 20, version=5)]))
    assert state.islands[IDS["b"]].gone == "expired"
    events = state.ingest(snap(T0 + 25, [record("a", T0 + 25, version=6), record("b", T0 + 25, version=6)]))
    assert [(e.kind, e.peer_id) for e in events] == [("rejoin", IDS["b"])]
    assert "back after 5s (expired)" in events[0].text
    assert state.islands[IDS["b"]].live


def test_sorting_puts_unknown_values_and_gone_islands_last_in_either_direction():
    state = SwarmState(expiry=30.0)
    fresh = record("a", T0, version=9).replace(loss=None, last_partner=None)  # no loss yet
    records = [fresh, record("b", T0, version=3), record("c", T0, version=7), record("d", T0, version=5)]
    state.ingest(snap(T0, records))
    state.ingest(snap(T0 + 1, [r.replace(timestamp=T0 + 1) for r in records[:3]]))  # d withdrawn: left
    order = lambda col, rev=False: [v.peer_id[0] for v in state.sorted_views(col, rev)]  # noqa: E731
    assert order("version") == ["b", "c", "a", "d"]
    assert order("version", True) == ["a", "c", "b", "d"]
    assert order("loss") == ["c", "b", "a", "d"]  # lower loss first (c has more versions), a has none
    assert order("loss", True) == ["b", "c", "a", "d"]
    assert order("behind") == ["a", "c", "b", "d"]
    assert order("id", True) == ["c", "b", "a", "d"]
    assert order("state") == ["a", "b", "c", "d"]


def test_histories_are_bounded_and_follow_the_swarm():
    state = fed(60)
    a = state.islands[IDS["a"]]
    assert [s.version for s in a.history] == list(range(20, 80))
    assert [s.live for s in state.history][:3] == [4, 4, 4] and state.history[-1].live == 3
    assert state.history[0].tokens_per_s == 10_000.0
    many = SwarmState()
    for i in range(HISTORY + 50):
        many.ingest(snap(T0 + i, [record("a", T0 + i, version=i)]))
    assert len(many.islands[IDS["a"]].history) == HISTORY and len(many.history) == HISTORY
    assert many.islands[IDS["a"]].history[0].version == 50


def test_replay_source_plays_frames_in_order():
    frames = [snap(t, records) for t, records in timeline(5)]
    got: list[Snapshot] = []
    ReplaySource(frames).start(got.append)
    assert got == frames
    paced: list[Snapshot] = []
    source = ReplaySource(frames, interval=0.01)
    source.start(paced.append)
    source.stop()
    assert paced == frames[: len(paced)]


def test_an_island_that_trains_alone_shows_so_with_why_and_when_it_mixes_again():
    state = fed(5)
    t, records = frame(5)
    why = "no partner state mixed in 10 rounds while 3 others train; 0.50 Mbit/s measured from partners"
    alone = [r.replace(alone=why) if r.peer_id == IDS["b"] else r for r in records]
    events = [e for e in state.ingest(snap(t, alone)) if e.kind == "alone"]
    assert [e.peer_id for e in events] == [IDS["b"]] and why in events[0].text
    assert state.islands[IDS["b"]].shown_state == "alone" and state.islands[IDS["a"]].shown_state == "training"
    events = [e for e in state.ingest(snap(t + 1, [r.replace(timestamp=t + 1) for r in records])) if e.kind == "alone"]
    assert [e.peer_id for e in events] == [IDS["b"]] and "again" in events[0].text
    assert state.islands[IDS["b"]].shown_state == "training"


def test_islands_and_partners_are_shown_by_name_or_peer_id_prefix():
    from p2p_diloco.tui.widgets import PeersTable

    state = fed(21)
    a, b = state.islands[IDS["a"]], state.islands[IDS["b"]]
    assert (a.label, b.label) == ("alpha-gpu", IDS["b"][:8])
    assert sorted(e.text.split()[0] for e in state.events if e.kind == "join") == ["alpha-gpu", IDS["b"][:8],
                                                                                   "carol-laptop", IDS["d"][:8]]
    assert state.label_of(IDS["c"]) == "carol-laptop" and state.label_of("ffffeeeeddddccccbbbb") == "ffffeeee"
    assert state.label_of(None) == "-"
    cells = PeersTable.cells(state, a, "red")  # (long labels are cut to fit the table)
    assert cells[0].plain == "alpha-gpu" and cells[-1].plain in ("bbbb0123", "carol-lap…", "dddd0123")
    assert [v.label for v in state.sorted_views("id")] == ["alpha-gpu", IDS["b"][:8], "carol-laptop", IDS["d"][:8]]
