"""`p2p-diloco demo`: a bootstrap node and K islands as separate processes on 127.0.0.1.

The demo is the product in miniature: real processes, real discovery, real ZeroMQ transfers. It
trains for a few minutes on the embedded data with the tiny model, shows progress (the dashboard
when a terminal is attached, else the islands' progress lines), then summarises: each island's
eval loss against its loss at start, bytes moved, optionally the data-parallel baseline at the
same tokens (`--compare`, computed in-process by the simulator's `dp` method), and a text sample
from the trained model.

However the demo ends (its islands done, Ctrl+C, SIGTERM, SIGHUP from a closed terminal, the
dashboard quit, an exception), `Swarm.stop()` ends every process it started: the children run in
sessions of their own, so no terminal signal reaches them, and nothing but the demo stops them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from p2p_diloco.config import DiLoCoConfig, NetworkConfig, to_toml
from p2p_diloco.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    islands: int = 4
    minutes: float = 3.0
    max_tokens: int | None = None
    """Train this many tokens per island instead of for `minutes` (the swarm benchmark's equal-token budget)."""
    latency_ms: float = 0.0
    """Emulated one-way latency of the islands' links (`bench member --latency-ms`)."""
    bandwidth_mbps: float | tuple[float, ...] | None = None
    """Emulated rate of the islands' uplinks (`bench member --bandwidth-mbps`): one for all, or one per
    island (a heterogeneous swarm)."""
    compare: bool = False
    local_steps: int = DiLoCoConfig.local_steps
    compression: str = NetworkConfig.compression
    offload_outer: bool = DiLoCoConfig.offload_outer
    update_codec: str = DiLoCoConfig.update_codec
    run_id: str = "demo"
    workdir: Path | None = None
    dashboard: bool = False
    """Show the live dashboard while the islands train (the CLI decides: only on a terminal)."""
    extra_args: tuple[str, ...] = ()
    data: str | None = None
    """Text or token shards to train on (None: the embedded default), as `join --data`."""
    vocab_size: int | None = None
    """Vocabulary of token shards, as `join --vocab-size`."""

    def data_args(self) -> tuple[str, ...]:
        """The islands' `--data` / `--vocab-size`, when set."""
        return ((("--data", self.data) if self.data else ())
                + (("--vocab-size", str(self.vocab_size)) if self.vocab_size else ()))

    def settings(self) -> dict[str, dict]:
        """The islands' settings that `join` takes from a config file only."""
        return {"island": {"eval_every": 5}, "network": {"compression": self.compression},
                "diloco": {"offload_outer": self.offload_outer, "update_codec": self.update_codec}}

    def __post_init__(self) -> None:
        rates = self.bandwidth_mbps
        if isinstance(rates, tuple) and (len(rates) != self.islands or min(rates) <= 0):
            raise ConfigError(f"bandwidth_mbps: one rate > 0 or {self.islands} of them (one per island), got {rates}")

    def island_command(self, k: int) -> tuple[str, ...]:
        """How island `k` is started: `join`, or `bench member` with its link emulated."""
        rates = self.bandwidth_mbps
        return tuple(link_command(self.latency_ms, rates[k] if isinstance(rates, tuple) else rates))


def link_command(latency_ms: float, bandwidth_mbps: float | None) -> list[str]:
    """`join`, or, for a link to emulate, `bench member` with its `--latency-ms` and `--bandwidth-mbps`
    (link emulation is a test double: the product's `join` does not take it)."""
    if not latency_ms and not bandwidth_mbps:
        return ["join"]
    return ["bench", "member", "--latency-ms", str(latency_ms),
            *(["--bandwidth-mbps", str(bandwidth_mbps)] if bandwidth_mbps else [])]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "p2p_diloco", *args]


TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What ends the demo from outside: Ctrl+C, `kill`, a closed terminal."""


def _exit_on_signal(signum, _frame) -> None:
    """The first of `TERMINAL_SIGNALS` ends the demo through `finally` (SIGINT as Ctrl+C always
    did); the later ones are ignored, so that they cannot cut the stopping of the children short."""
    for sig in TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextmanager
def _signals(handler) -> Iterator[None]:
    """`TERMINAL_SIGNALS` go to `handler` inside the block, except one ignored on entry: `nohup`
    keeps the demo running after a hangup, a shell's background job is deaf to Ctrl+C. Only the
    main thread can set handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [sig for sig in TERMINAL_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in taken}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:  # None: set outside Python, and it cannot be put back
                signal.signal(sig, old)


class Swarm:
    """A bootstrap node and islands as child processes, each in its own session; `stop()` reaps them all.
    `settings`: config sections every island is given in a config file (`islands.toml`)."""

    def __init__(self, workdir: Path, settings: dict[str, dict] | None = None) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.bootstrap_addr: list[str] = []
        self._files: list = []
        self._config: tuple[str, ...] = ()
        if settings:
            path = workdir / "islands.toml"
            path.write_text(to_toml(settings))
            self._config = ("--config", str(path))

    def _spawn(self, args: list[str], log_name: str, stdout=None) -> subprocess.Popen:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        err = open(self.workdir / log_name, "w")
        self._files += [err] + ([stdout] if stdout else [])
        p = subprocess.Popen(args, stdout=stdout or err, stderr=err, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def start_bootstrap(self, timeout: float = 60.0, *args: str) -> list[str]:
        """Start the bootstrap node (with `args`, more of its options) and return its addresses."""
        addr_file = self.workdir / "bootstrap.addr"
        self._spawn(_cli("bootstrap", "--port", "0", "--identity", str(self.workdir / "bootstrap.key"),
                         "--addr-file", str(addr_file), *args), "bootstrap.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if addr_file.exists() and addr_file.read_text().strip():
                self.bootstrap_addr = addr_file.read_text().split()
                return self.bootstrap_addr
            if self.procs[-1].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the bootstrap node did not start; see {self.workdir / 'bootstrap.log'}")

    def start_island(self, name: str, args: list[str], command: tuple[str, ...] = ("join",),
                     logs: str | None = None) -> subprocess.Popen:
        """An island process: `join` (or `command`, which takes join's options: `bench member ...`); in a
        work folder used before (`--workdir`), its earlier run moved aside (`--fresh`) unless it resumes.
        Its log and summary go to `<logs>.log` and `<logs>.json` (default: its name; a second life of
        an island that resumes keeps the first one's)."""
        boot = [a for addr in self.bootstrap_addr for a in ("--bootstrap", addr)]
        out = open(self.workdir / f"{logs or name}.json", "w")
        fresh = [] if "--resume" in args else ["--fresh"]
        return self._spawn(_cli(*self._config, *command, *boot, "--run-dir", str(self.workdir / name), "--name", name, "--json",
                                *fresh, *args), f"{logs or name}.log", stdout=out)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process itself (not its group: an island's libp2p daemon must outlive it long
        enough to withdraw its record), then SIGKILL each one's whole group (what is left of it after
        `grace`: its DHT process and libp2p daemon too) and reap it. Signals that come meanwhile are
        ignored, so that a second Ctrl+C cannot leave a process behind; this takes at most `grace`."""
        with _signals(signal.SIG_IGN):
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for p in self.procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            for f in self._files:
                f.close()


def _follow(paths: list[Path], stop: threading.Event, out=sys.stderr) -> None:
    """Copy the islands' progress lines to our stderr as they are written."""
    offsets = {p: 0 for p in paths}
    while not stop.is_set():
        for p in paths:
            if p.exists():
                with open(p) as f:
                    f.seek(offsets[p])
                    chunk = f.read()
                    offsets[p] = f.tell()
                for line in chunk.splitlines():
                    if line.startswith("["):
                        out.write(line + "\n")
        out.flush()
        stop.wait(0.5)


def run_swarm(cfg: DemoConfig) -> tuple[Path, list[str], list[dict]]:
    """Start the bootstrap node and the islands, wait until they finish; returns their summaries."""
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="p2p-diloco-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    swarm = Swarm(workdir, cfg.settings())
    names = [f"island-{i}" for i in range(cfg.islands)]
    limit_args = ["--max-tokens", str(cfg.max_tokens)] if cfg.max_tokens else ["--max-seconds", str(cfg.minutes * 60)]
    args = ["--run-id", cfg.run_id, *limit_args, "-H", str(cfg.local_steps), "--wait-for", str(cfg.islands),
            *cfg.data_args(), *cfg.extra_args]
    stop_follow = threading.Event()
    with _signals(_exit_on_signal):  # SIGTERM and SIGHUP end the demo as Ctrl+C does: through `finally`
        try:
            swarm.start_bootstrap()
            islands = [swarm.start_island(n, args, cfg.island_command(k)) for k, n in enumerate(names)]
            if cfg.dashboard:
                _dashboard_until_done(swarm, cfg, islands)
            else:
                threading.Thread(target=_follow, args=([workdir / f"{n}.log" for n in names], stop_follow),
                                 daemon=True).start()
            limit = cfg.minutes * 60 + 120 if not cfg.max_tokens else None  # plus start-up, checkpoint and evaluation
            for p in islands:
                p.wait(timeout=limit)
        finally:
            stop_follow.set()
            swarm.stop()
    summaries = []
    for n in names:
        text = (workdir / f"{n}.json").read_text().strip()
        if not text:
            raise RuntimeError(f"{n} ended without a summary; see {workdir / (n + '.log')}")
        summaries.append(json.loads(text.splitlines()[-1]))
    return workdir, names, summaries


def run_demo(cfg: DemoConfig) -> dict:
    """Run the demo swarm to completion and return the summary (see `p2p-diloco demo --help`)."""
    workdir, names, summaries = run_swarm(cfg)
    out = {"islands": [{"id": s["name"], "peer_id": s["peer_id"], "initial_loss": s["initial_loss"], "eval_loss": s["eval_loss"],
                        "tokens": s["tokens"], "version": s["version"], "mixes": s["mixes"], "refused": s["refused"],
                        "failed_fetches": s["failed_fetches"], "too_stale": s["too_stale"], "alone": s["alone"],
                        "alone_episodes": s["alone_episodes"],
                        "utilization": s["utilization"]} for s in summaries],
           "baseline_eval_loss": None, "bytes_moved": sum(s["bytes_in"] for s in summaries), "sample": "",
           "workdir": str(workdir)}
    best = min(range(len(summaries)), key=lambda i: summaries[i]["eval_loss"])
    if cfg.vocab_size in (None, 256):  # token shards cannot be turned back into text without their tokenizer
        out["sample"] = sample_text(workdir / names[best] / "checkpoints")
    if cfg.compare:
        out["baseline_eval_loss"] = baseline_dp(sum(s["tokens"] for s in summaries), cfg.islands, cfg.data,
                                                cfg.vocab_size)
    return out


def sample_text(checkpoints: Path, prompt: str = "def ", n_bytes: int = 240, seed: int = 0) -> str:
    """Generate text from a checkpoint's anchor with the default tiny model."""
    import torch

    from p2p_diloco.config import ModelConfig
    from p2p_diloco.core.island import load_vector
    from p2p_diloco.core.model import build_model
    from p2p_diloco.peers.state import checkpoint

    ck = checkpoint.load(checkpoint.latest(checkpoints))
    model = build_model(ModelConfig())
    load_vector(model, ck.tensors[checkpoint.ANCHOR])
    model.eval()
    idx = torch.tensor([list(prompt.encode())], dtype=torch.long)
    out = model.generate(idx, n_bytes, generator=torch.Generator().manual_seed(seed))
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")


def baseline_dp(tokens: int, islands: int, data: str | None = None, vocab_size: int | None = None) -> float:
    """Eval loss of data parallel training (K-times batch every step) at the same total tokens."""
    from p2p_diloco.config import ModelConfig, TrainConfig
    from p2p_diloco.sim.config import SimConfig
    from p2p_diloco.core.data import load_corpus
    from p2p_diloco.sim.simulator import Simulation

    sim = SimConfig(islands=islands, methods=("dp",), tokens=max(tokens, 1))
    return Simulation(sim, ModelConfig(), TrainConfig(), DiLoCoConfig(),
                      load_corpus(data, vocab_size)).run("dp").eval_loss



def _dashboard_until_done(swarm: Swarm, cfg: DemoConfig, islands: list[subprocess.Popen]) -> None:
    """Show the dashboard until every island has exited; quitting it early stops the islands cleanly."""
    from p2p_diloco.config import DiscoveryConfig
    from p2p_diloco.tui import MembershipSource, run_dashboard

    done = threading.Event()

    def watch() -> None:
        for p in islands:
            p.wait()
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    source = MembershipSource(DiscoveryConfig(run_id=cfg.run_id, bootstrap=tuple(swarm.bootstrap_addr)))
    code = run_dashboard(source, stop_event=done)
    if code == 130:
        raise KeyboardInterrupt
    if code > 128:  # SIGTERM or SIGHUP while it showed: the demo ends as on Ctrl+C
        raise SystemExit(code)
    if not done.is_set():  # the user quit: islands checkpoint and report as on Ctrl+C
        for p in islands:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
