"""Drives real islands (`p2p-diloco join` processes) for the swarm tests.

An `IslandProc` is one island process with its own run dir; its summary (`--json`) and its
`metrics.jsonl` are what tests assert on. Islands use a small model so that a round takes a
fraction of a second on a shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from discovery_harness import Bootstrap, free_port_pair, wait_until  # noqa: F401  (re-exported)
from p2p_diloco.config import to_toml
from p2p_diloco.peers.reports.metrics import read_metrics

SMALL_MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64}
"""The islands' model ([model] in their config file), with `--batch-size 8`."""


class IslandProc:
    def __init__(self, procs, tmp: Path, name: str, bootstrap: list[str], *args: str, discovery: str = "zmq",
                 run_id: str = "swarm", launcher: list[str] | None = None, run_dir: Path | None = None,
                 command: tuple[str, ...] = ("join",), every: int = 2, settings: dict[str, dict] | None = None) -> None:
        """`command`: `join`, or `("bench", "member")` for an island with faults injected; `every`: rounds
        between evaluations and checkpoints; `settings`: more config sections for its config file."""
        self.name, self.run_dir = name, run_dir or tmp / name
        config = tmp / f"{name}.toml"
        config.write_text(to_toml({"model": SMALL_MODEL, "island": {"eval_every": every, "checkpoint_every": every},
                                   **(settings or {})}))
        cmd = [*(launcher or [sys.executable]), "-m", "p2p_diloco", "--config", str(config), *command, "--run-id", run_id,
               "--discovery", discovery, "--run-dir", str(self.run_dir), "--name", name, "--json", "--batch-size", "8",
               *args]
        for b in bootstrap:
            cmd += ["--bootstrap", b]
        self.log = tmp / f"{name}.{len(list(tmp.glob(name + '.*.log')))}.log"
        self.out = self.log.with_suffix(".json")
        self.proc = procs.spawn(cmd, stdout=open(self.out, "w"), stderr=open(self.log, "w"))

    @property
    def peer_id(self) -> str:
        info = self.run_dir / "island.json"
        wait_until(info.exists, 60, f"{self.name}'s island.json")
        return json.loads(info.read_text())["peer_id"]

    def rounds(self) -> list[dict]:
        return [r for r in read_metrics(self.run_dir) if "round" in r]

    def wait_rounds(self, n: int, timeout: float) -> list[dict]:
        wait_until(lambda: len(self.rounds()) >= n or self.proc.poll() is not None, timeout, f"{self.name} to do {n} rounds")
        assert len(self.rounds()) >= n, f"{self.name} exited early:\n{self.tail()}"
        return self.rounds()

    def summary(self, timeout: float = 120, expect: int = 0) -> dict:
        code = self.proc.wait(timeout)
        assert code == expect, f"{self.name} exited with {code}:\n{self.tail()}"
        return json.loads(self.out.read_text().splitlines()[-1])

    def mixed_partners(self) -> set[str]:
        """Peer ids whose state this island has mixed in (a round with a partner and a weight)."""
        return {r["partner"] for r in self.rounds() if r.get("partner") and r.get("weight")}

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig) if sig == signal.SIGKILL else os.kill(self.proc.pid, sig)

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:]


def run_until_mixed(islands: list[IslandProc], rounds: int, timeout: float, mixes_once_all_in: int = 0) -> list[dict]:
    """Let islands (started with a large --max-rounds) train until each has done `rounds` rounds and
    mixed a partner's state, and `mixes_once_all_in` mixes after the last of them started its
    first round; then stop them with SIGTERM and return their summaries.

    Islands come up at different moments (each starts its own discovery node), so a fixed round
    count is a race: a fast starter can finish before the others are in the swarm.
    """
    for isl in islands:
        wait_until(lambda: (len(isl.rounds()) >= rounds and isl.mixed_partners()) or isl.proc.poll() is not None,
                   timeout, f"{isl.name} to do {rounds} rounds and mix with a partner")
    if mixes_once_all_in:
        all_in = max(isl.rounds()[0]["time"] for isl in islands)
        for isl in islands:
            wait_until(lambda: len([r for r in isl.rounds() if r.get("weight") and r["time"] > all_in])
                       >= mixes_once_all_in or isl.proc.poll() is not None,
                       timeout, f"{isl.name} to mix {mixes_once_all_in} times once all islands are in")
    for isl in islands:
        isl.signal(signal.SIGTERM)
    return [isl.summary(60, expect=143) for isl in islands]


def start_bootstrap(procs, tmp: Path, discovery: str = "zmq") -> tuple[Bootstrap, list[str]]:
    boot = Bootstrap(procs, tmp, free_port_pair(), "auto" if discovery == "dht" else "zmq")
    boot.start()
    return boot, [boot.multiaddr if discovery == "dht" else boot.rendezvous]
