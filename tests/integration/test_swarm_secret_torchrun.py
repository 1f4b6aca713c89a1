"""A swarm secret keeps an outsider out; a torchrun island of two processes gossips with a plain one."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from swarm_harness import IslandProc, run_until_mixed, start_bootstrap

pytestmark = pytest.mark.timeout(240)


def test_island_without_the_secret_cannot_join_or_inject(procs, tmp_path):
    """Members hold the secret (from a file, as the README says); the outsider does not. Discovery
    is sealed, so it never even learns where a member is, and nothing of it reaches the members
    (that an outsider who knows an endpoint still cannot fetch or serve is test_transport's part)."""
    _, entry = start_bootstrap(procs, tmp_path)
    secret = tmp_path / "swarm.secret"
    secret.write_text("swarm-key\n")
    secret.chmod(0o600)
    members = [IslandProc(procs, tmp_path, f"s{k}", entry, "-H", "8", "--max-rounds", "1000", "--secret-file", str(secret))
               for k in range(2)]
    outsider = IslandProc(procs, tmp_path, "outsider", entry, "-H", "8", "--max-rounds", "1000")
    intruder_id = outsider.peer_id
    run_until_mixed(members, 10, 150)  # the members did gossip together
    for m in members:
        rows = m.rounds()
        # the outsider's state was never mixed in, and nothing it served reached the members
        assert not [r for r in rows if r.get("partner") == intruder_id], rows
    outsider.wait_rounds(3, 60)
    outsider.signal(signal.SIGTERM)
    outsider.summary(60, expect=143)
    out_rows = outsider.rounds()
    assert not [r for r in out_rows if r.get("weight")], "the outsider mixed a member's state"
    assert not [r for r in out_rows if r.get("partner") or "fetch_error" in r], "the outsider found a member"


def test_torchrun_island_joins_a_plain_island(procs, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    _, entry = start_bootstrap(procs, tmp_path)
    plain = IslandProc(procs, tmp_path, "plain", entry, "-H", "8", "--max-rounds", "500")
    plain.wait_rounds(2, 120)  # the run is going: the torchrun island must join it, not start afresh
    group = IslandProc(procs, tmp_path, "group", entry, "-H", "8", "--max-rounds", "10",
                       launcher=[str(torchrun), "--standalone", "--nproc-per-node", "2"])
    s_group = group.summary(200)
    plain.signal(signal.SIGTERM)
    assert plain.proc.wait(30) == 143
    plain_id = plain.peer_id
    steps = [r["steps"] for r in group.rounds()]
    assert len(steps) == 10 and min(steps) >= 8  # H steps a round, more while it ran ahead of the plain island
    per_step = 2 * 8 * 64  # two ranks: twice the tokens per step
    if "catching up from the freshest members" in group.tail(200_000):
        # (started behind on a loaded machine: the steps of the round a catch-up replaced were trained on, so
        # they count as tokens, but not as that round's steps)
        assert s_group["tokens"] % per_step == 0 and s_group["tokens"] >= per_step * sum(steps), s_group
    else:
        assert s_group["tokens"] == per_step * sum(steps), s_group
    first = group.rounds()[0]
    assert first["version"] > 1, "the torchrun island started from scratch instead of the swarm's state"
    assert s_group["initial_loss"] < 4.5  # its first evaluation already saw the swarm's trained state (ln 256 = 5.55)
    assert s_group["eval_loss"] < min(3.5, s_group["initial_loss"] + 0.15)  # kept (and kept training) the learned state
    assert any(r.get("partner") == plain_id and r.get("weight") for r in group.rounds())
    assert any(r.get("partner") == s_group["peer_id"] and r.get("weight") for r in plain.rounds())
