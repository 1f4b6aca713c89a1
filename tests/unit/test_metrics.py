"""LinkRates: the rates an island reports average bursty transfers over a window of rounds."""

from p2p_diloco.peers.metrics import LinkRates


def test_a_burst_shows_as_a_rate_until_it_leaves_the_window():
    rates = LinkRates(window_s=30.0, now=0.0)
    assert rates.update(1.0, 0, 0) == (0.0, 0.0)
    up, down = rates.update(2.0, 3_000_000, 1_000_000)  # one snapshot served, one fetched
    assert (up, down) == (1_500_000.0, 500_000.0)
    for t in range(4, 32, 2):  # quiet records every 2 s: the burst stays in the average
        up, down = rates.update(float(t), 3_000_000, 1_000_000)
        assert up == 3_000_000 / t and down == 1_000_000 / t
    for t in range(32, 40, 2):  # the window slides past the burst
        up, down = rates.update(float(t), 3_000_000, 1_000_000)
    assert (up, down) == (0.0, 0.0)


def test_the_window_keeps_a_bounded_number_of_samples():
    rates = LinkRates(window_s=10.0, now=0.0)
    for t in range(1, 1000):
        up, _ = rates.update(float(t), 1000 * t, 0)
        assert up == 1000.0
    assert len(rates._samples) <= 12


def test_the_line_an_island_leaves_with_says_what_its_exchanges_came_to():
    import io

    from p2p_diloco.peers.metrics import summary_line

    out = io.StringIO()
    summary = {"name": "a", "rounds": 40, "mixes": 0, "failed_fetches": 2, "too_stale": 3, "alone": "no partner ..."}
    summary_line(summary, out)
    summary_line({**summary, "alone": None, "mixes": 31}, out)
    assert out.getvalue().splitlines() == [
        "[a] left after 40 rounds: 0 partner states mixed, 2 fetches failed, 3 too stale to mix; trained alone: no partner ...",
        "[a] left after 40 rounds: 31 partner states mixed, 2 fetches failed, 3 too stale to mix"]
