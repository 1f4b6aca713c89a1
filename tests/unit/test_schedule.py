"""`core.schedule`: the decisions the swarm's islands and the simulator make alike, and that both use it."""

from p2p_diloco.core.schedule import ring_successor, worth_fetching


def test_the_ring_is_the_next_id_in_sorted_order_wrapping_around():
    assert ring_successor(["c", "a", "b"], "a") == "b"
    assert ring_successor(["c", "a", "b"], "c") == "a"
    assert ring_successor([0, 2, 3], 1) == 2  # own id need not be among the candidates
    assert ring_successor([3], 3) is None and ring_successor([], 0) is None


def test_a_partner_that_trained_nothing_is_not_worth_fetching():
    assert not worth_fetching(0) and worth_fetching(1)


def test_the_island_and_the_simulator_decide_by_the_same_code():
    """The ring and the untrained partner are decided in `core.schedule`, by both (the simulator's
    islands are indices, the swarm's peer ids)."""
    from p2p_diloco.core.modes import exchange_mode
    from p2p_diloco.discovery.records import IslandRecord
    from p2p_diloco.peers.gossip.partners import PartnerChooser

    ids = ["1d", "a2", "ac"]
    members = {i: IslandRecord(peer_id=i, endpoint=f"tcp://127.0.0.1:{k + 1}", version=3, tokens=10, state="training",
                               timestamp=0.0) for k, i in enumerate(ids)}
    chooser = PartnerChooser("a2", 8, ring=exchange_mode("updates", "sign").ring)
    assert chooser.choose(members, 3).peer_id == ring_successor(ids, "a2") == "ac"
    members["ac"] = IslandRecord(peer_id="ac", endpoint="tcp://127.0.0.1:3", version=3, tokens=0, state="training",
                                 timestamp=0.0)
    assert chooser.choose(members, 3).peer_id == "1d"  # untrained: the next one on the ring


def test_a_rounds_shifted_partners_are_a_permutation_the_same_for_indices_and_peer_ids():
    from p2p_diloco.core.schedule import shifted_partner

    for r in range(20):
        picks = [shifted_partner(range(5), i, r, salt=3) for i in range(5)]
        assert sorted(picks) == list(range(5)) and all(p != i for i, p in enumerate(picks))
        ids = ["p0", "p1", "p2", "p3", "p4"]  # sorted as the indices are: the same permutation
        assert [shifted_partner(ids, own, r, salt=3) for own in ids] == [ids[p] for p in picks]
    assert shifted_partner([], "a", 0) is None and shifted_partner(["a"], "a", 0) is None
