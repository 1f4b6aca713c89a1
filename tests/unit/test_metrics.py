"""LinkRates: the rates an island reports average bursty transfers over a window of rounds."""

from p2p_diloco.peers.reports.metrics import LinkRates


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

    from p2p_diloco.peers.reports.metrics import summary_line

    out = io.StringIO()
    summary = {"name": "a", "rounds": 40, "mixes": 0, "refused": 5, "failed_fetches": 2, "too_stale": 3,
               "alone": "no partner ...", "alone_episodes": 1}
    summary_line(summary, out)
    summary_line({**summary, "alone": None, "mixes": 31}, out)
    summary_line({**summary, "alone": None, "alone_episodes": 0, "mixes": 31, "refused": 0}, out)
    assert out.getvalue().splitlines() == [
        "[a] left after 40 rounds: 0 partner states mixed, 5 refused, 2 fetches failed, 3 too stale to mix; "
        "trained alone: no partner ...",
        "[a] left after 40 rounds: 31 partner states mixed, 5 refused, 2 fetches failed, 3 too stale to mix; "
        "trained alone 1 time(s) for a while",
        "[a] left after 40 rounds: 31 partner states mixed, 0 refused, 2 fetches failed, 3 too stale to mix"]


def test_the_progress_line_names_the_partner_by_its_label():
    import io

    from p2p_diloco.discovery.records import IslandRecord, label_among
    from p2p_diloco.peers.reports.metrics import progress_line

    members = {"f3f663bc0123456789ab": IslandRecord(peer_id="f3f663bc0123456789ab", endpoint="tcp://h:1", name="gpu-2")}
    row = {"round": 3, "version": 3, "loss": 2.5, "tokens_per_s": 1000.0, "bytes_in": 2e6, "utilization": 0.9}
    out = io.StringIO()
    for partner in ("f3f663bc0123456789ab", "0123456789abcdef0123", None):
        progress_line("island-0", row, label_among(members, partner), out)
    assert [line.split(" partner ")[1].split()[0] for line in out.getvalue().splitlines()] == ["gpu-2", "01234567", "-"]
