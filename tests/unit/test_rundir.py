"""One island per run directory (`peers/state/rundir.py`), across processes."""

import logging
import os
import signal
import subprocess
import sys

import pytest

from p2p_diloco.peers.state.rundir import LOCK_NAME, RunDirInUse, RunDirLock

pytestmark = pytest.mark.timeout(60)


HOLD = ("import sys; from p2p_diloco.peers.state.rundir import RunDirLock; lock = RunDirLock(sys.argv[1]); "
        "print('ready', flush=True); sys.stdin.read(); lock.release()")


@pytest.fixture
def holder(tmp_path):
    """Another process holding `tmp_path` until its stdin closes; yields that process."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", "the holding process did not take the lock"
        yield proc
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_a_second_island_on_a_directory_in_use_gets_a_one_line_error(tmp_path, holder):
    proc = holder
    with pytest.raises(RunDirInUse, match=f"in use by the island of process {proc.pid}") as err:
        RunDirLock(tmp_path)
    assert "\n" not in str(err.value) and "own run directory" in str(err.value)


def test_the_lock_of_a_killed_island_is_taken_over_with_a_warning(tmp_path, holder, caplog):
    proc = holder
    os.kill(proc.pid, signal.SIGKILL)  # no release: the kernel frees the flock, the pid stays in the file
    proc.wait(10)
    with caplog.at_level(logging.WARNING):
        lock = RunDirLock(tmp_path)
    assert f"taking over the lock of process {proc.pid}" in caplog.text
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    RunDirLock(tmp_path).release()  # free again


def test_a_released_directory_is_free_for_the_next_island(tmp_path, holder):
    holder.stdin.close()
    assert holder.wait(10) == 0
    assert not (tmp_path / LOCK_NAME).exists()
    RunDirLock(tmp_path).release()
