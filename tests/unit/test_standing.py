"""A partner's record as an island reads it: its own, and what the members it trusts report
(`peers.admission.trust.standing`), with members that lie about everyone."""

import pytest

from p2p_diloco.admission import TrustSettings
from p2p_diloco.discovery.records import IslandRecord
from p2p_diloco.peers.admission.ledger import PartnerLedger
from p2p_diloco.peers.admission.trust import share, standing

S = TrustSettings()
SLACK = S.slack


def members(**doubts: dict) -> dict[str, IslandRecord]:
    return {pid: IslandRecord(peer_id=pid, endpoint="tcp://127.0.0.1:9000", doubts=told, name=pid)
            for pid, told in doubts.items()}


def ledger(**records: float) -> PartnerLedger:
    out = PartnerLedger("me")
    for pid, record in records.items():
        out[pid].record = record
    return out


def test_a_member_doubted_by_the_islands_it_trusts_is_held_before_its_own_record_grows():
    told = members(h1={"m": 1.0}, h2={"m": 0.8}, h3={"m": 0.9})
    assert standing("m", ledger(h1=0.0, h2=0.1, h3=0.05), told, S) == pytest.approx(0.9)  # the lower median
    assert standing("m", ledger(h1=0.0, h2=0.1, h3=0.05, m=0.1), told, S) == pytest.approx(0.9)
    assert standing("m", ledger(h1=0.0, h2=0.1, h3=0.05, m=2.0), told, S) == pytest.approx(2.0)  # its own is higher
    assert share(0.9, SLACK) == pytest.approx(SLACK / 0.9) and share(0.2, SLACK) == 1.0 and share(None, SLACK) == 1.0


def test_reports_count_only_from_members_this_island_found_within_its_slack():
    told = members(h1={"m": 1.2}, liar={"m": 0.0, "h1": 10.0}, stranger={"h1": 10.0})
    # the liar's states sat back (its record is beyond the slack), the stranger's were never mixed here
    assert standing("h1", ledger(h1=0.0, liar=1.5), told, S) == 0.0
    assert standing("m", ledger(h1=0.0, liar=1.5), told, S) == pytest.approx(1.2)
    assert standing("x", ledger(h1=0.0), told, S) is None


def test_liars_trusted_so_far_move_the_reading_only_where_they_are_most_of_the_reporters():
    ledgered = ledger(h1=0.0, h2=0.0, h3=0.1, l1=0.1, l2=0.2)  # two liars whose states passed so far
    told = members(h1={"m": 1.0, "h4": 0.0}, h2={"m": 0.9, "h4": 0.1}, h3={"m": 1.1},
                   l1={"m": 0.0, "h4": 10.0}, l2={"m": 0.0, "h4": 10.0})
    assert standing("h4", ledgered, told, S) == pytest.approx(0.1)  # reports 0, 0.1, 10, 10: the lower median
    assert standing("m", ledgered, told, S) == pytest.approx(0.9)  # 0, 0, 0.9, 1.0, 1.1


def test_an_island_tells_its_highest_records_of_members_it_knows():
    own = ledger(**{f"p{i:02d}": i / 10 for i in range(20)}, gone=5.0)
    own["fresh"]  # an entry without a record yet
    told = own.doubts(members(**{f"p{i:02d}": {} for i in range(20)}, fresh={}))
    assert len(told) == 16 and min(told.values()) == pytest.approx(0.4) and "gone" not in told
    assert IslandRecord(peer_id="me", endpoint="tcp://127.0.0.1:9000", doubts=told).doubts == told
    # a partner whose states sat many rounds back has a record beyond what a discovery record carries
    far = ledger(stuck=25.0).doubts(members(stuck={}))
    assert far == {"stuck": 10.0} and IslandRecord(peer_id="me", endpoint="tcp://127.0.0.1:9000", doubts=far).doubts == far


def test_members_that_contradict_what_this_island_saw_are_not_heard_on_anything():
    told = members(l1={"h1": 10.0, "h2": 10.0, "l2": 0.0}, l2={"h1": 10.0, "h2": 10.0, "l1": 0.0})
    early = ledger(l1=0.0, l2=0.1)  # the liars' first states passed; no honest island mixed here yet
    assert standing("h2", early, told, S) == 10.0  # what this island cannot yet tell from the truth
    later = ledger(l1=0.0, l2=0.1, h1=0.0)  # one honest island mixed: the liars doubted it at 10
    assert standing("h2", later, told, S) is None
    vouched = ledger(l1=0.0, l2=1.4)  # or one of them sat back here, and the other vouched for it
    assert standing("h2", vouched, told, S) is None
    honest = members(h1={"l2": 0.6, "m": 1.5})  # an honest report within `agree` of this island's own
    assert standing("m", ledger(h1=0.0, l2=1.4), honest, S) == 1.5


def test_bench_attacks_members_lie_in_their_records_as_colluders_would():
    from p2p_diloco.bench.member import LyingLedger
    from p2p_diloco.discovery.records import MAX_DOUBT

    seen = members(**{"member-0": {}, "member-1": {}, "honest-0": {}, "honest-1": {}})
    liar = LyingLedger("member-0")
    liar["honest-0"].record = 0.0  # what it measured does not matter
    told = liar.doubts(seen)
    assert told == {"honest-0": MAX_DOUBT, "honest-1": MAX_DOUBT, "member-1": 0.0}
    reports = members(**{"member-0": told, "member-1": LyingLedger("member-1").doubts(seen)})
    # an island that mixed honest-0 itself stops heeding them; one that has not is misled until it has
    assert standing("honest-1", ledger(**{"member-0": 0.0, "member-1": 0.0, "honest-0": 0.0}), reports, S) is None
    assert standing("honest-1", ledger(**{"member-0": 0.0, "member-1": 0.0}), reports, S) == MAX_DOUBT
