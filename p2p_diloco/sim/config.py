"""The simulator's settings: islands, token budget, links and faults (`p2p-diloco simulate`).

A config section like those of `p2p_diloco.config` (frozen, validated at construction, the CLI's
option defaults), kept with the simulator because nothing else reads it. Plain Python (no torch),
so the CLI builds it without loading the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p_diloco.config import CODECS, _require

SIM_METHODS = ("gossip", "allreduce", "dp")
"""What the simulator compares: gossip DiLoCo, synchronous DiLoCo, data parallel."""


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """What the simulator runs: islands, budget, link and fault settings."""

    islands: int = 4
    """K: number of islands."""
    methods: tuple[str, ...] = SIM_METHODS
    """Which of `SIM_METHODS` to run."""
    tokens: int = 1_500_000
    """Total training tokens (all islands together), the same for every method."""
    time_budget: float | None = None
    """Virtual seconds; when set, every method stops when it is spent instead of at `tokens`."""
    speeds: tuple[float, ...] | None = None
    """Relative speed per island (1 = nominal); None means all 1."""
    drop_prob: float = 0.0
    """Chance that an island misses a round (offline for that round's duration)."""
    latency_ms: float = 100.0
    """One-way latency of every simulated link."""
    bandwidth_mbps: float | tuple[float, ...] = 1000.0
    """Download rate of every island's link, Mbit/s, or one per island (home links differ)."""
    upload_mbps: float | tuple[float, ...] | None = None
    """Upload rate, Mbit/s, one for all or one per island (None: as the download). A fetch from j
    to i runs at the slower of j's upload and i's download."""
    compression: str = "int8"
    """Codec applied to every exchanged state and counted in the bytes."""
    update_keep: int = 0
    """Updates a sender keeps; a receiver further behind fetches the public state whole (fp32). 0: as
    many as an island keeps (`core.public.worth_keeping`)."""
    mix_delay: int = 1
    """Rounds between a partner's state being published and being mixed (0 or 1)."""
    step_seconds: float = 0.32
    """Virtual seconds of one inner step on a speed-1 island: the tiny model's step with 4 islands
    sharing the 2-core reference machine, as `bench swarm` measured it there when idle (BENCHMARKS.md,
    "Simulator"). Against the link time it decides how many inner steps of a round run before a
    partner's state arrives."""
    eval_batches: int = 16
    """Held-out batches every method is evaluated on."""
    seed: int = 0
    """Seed of the initial weights, the data order and the simulated faults."""

    def __post_init__(self) -> None:
        s = "simulate"
        _require(self.islands >= 2, s, "islands", ">= 2", self.islands)
        _require(bool(self.methods) and set(self.methods) <= set(SIM_METHODS), s, "methods", f"a subset of {SIM_METHODS}", self.methods)
        _require(self.tokens >= 1, s, "tokens", ">= 1", self.tokens)
        _require(self.time_budget is None or self.time_budget > 0, s, "time_budget", "> 0", self.time_budget)
        _require(self.step_seconds > 0, s, "step_seconds", "> 0", self.step_seconds)
        _require(self.speeds is None or (len(self.speeds) == self.islands and min(self.speeds) > 0), s, "speeds",
                 f"{self.islands} positive numbers", self.speeds)
        _require(0 <= self.drop_prob < 1, s, "drop_prob", "in [0, 1)", self.drop_prob)
        _require(self.latency_ms >= 0, s, "latency_ms", ">= 0", self.latency_ms)
        for name in ("bandwidth_mbps", "upload_mbps"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) == 1:  # one rate for every island, as a comma list of one gives it
                object.__setattr__(self, name, v := v[0])
            rates = v if isinstance(v, tuple) else (v,)
            _require((v is None and name == "upload_mbps") or (len(rates) in (1, self.islands) and min(rates) > 0), s,
                     name, f"a rate > 0 or {self.islands} of them", v)
        _require(self.compression in CODECS, s, "compression", f"one of {CODECS}", self.compression)
        _require(self.mix_delay in (0, 1), s, "mix_delay", "0 or 1", self.mix_delay)
        _require(self.update_keep >= 0, s, "update_keep", ">= 0", self.update_keep)

    def speed(self, i: int) -> float:
        return 1.0 if self.speeds is None else self.speeds[i]

    def download(self, i: int) -> float:
        """Island i's download rate, Mbit/s."""
        return _of(self.bandwidth_mbps, i)

    def upload(self, i: int) -> float:
        """Island i's upload rate, Mbit/s."""
        return self.download(i) if self.upload_mbps is None else _of(self.upload_mbps, i)


def _of(rates: float | tuple[float, ...], i: int) -> float:
    """Island i's entry of a rate given once for all islands or once per island."""
    return rates[i] if isinstance(rates, tuple) else rates
