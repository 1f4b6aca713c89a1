"""Configuration as frozen dataclasses, one per section, validated once at construction.

Precedence (applied by the CLI): command-line flag > environment variable `P2P_DILOCO_*` > TOML
file (`--config FILE`) > the defaults below. Every field is documented right under it; every
`__post_init__` names the field and its allowed range when a value is rejected. The CLI's options
take their defaults from these fields, so a default is written once, here.

Plain Python on purpose (no torch): the CLI, the dashboard and discovery build configs without
loading the training core. Accepted names live in `p2p_diloco.choices`; the simulator's section in `sim.config`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_diloco import addresses
from p2p_diloco.choices import (  # noqa: F401 - importers take these from p2p_diloco.config too
    CODECS, COMPILES, DEVICE_RE, DEVICES_HELP, DHT_PORT_OFFSET, DISCOVERY_KINDS, EXCHANGES, MAX_FRAGMENTS, MAX_NAME_CHARS, MODEL_PRESETS,
    LLAMA_PRESETS,
    MOMENTUM_MODES, PRECISIONS, PX_PORT_OFFSET, REACH_MODES, SHARDS, UPDATE_CODECS, WIRE_CODECS, valid_name
)
from p2p_diloco.errors import ConfigError, require
from p2p_diloco.model_config import ModelConfig  # noqa: F401 - importers take it from p2p_diloco.config too


_require = require


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The inner (local) optimizer: AdamW with warmup, cosine decay and gradient clipping."""

    batch_size: int = 16
    """Sequences per inner step on one island."""
    lr: float = 3e-3
    """Peak inner learning rate."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of `lr`."""
    warmup_steps: int = 50
    """Linear warmup steps of the inner learning rate."""
    total_steps: int = 2000
    """Inner steps over which the cosine schedule decays (the island's expected step count)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""
    seed: int = 0
    """Seed for model initialisation and data order: islands of one run share it, and their initial weights."""
    threads: int = 1
    """torch threads of the island's process (one per island: islands sharing a machine share its cores)."""
    device: str = "auto"
    """Where the model, inner optimizer and outer state live: auto|cpu|cuda|cuda:N|mps. Its syntax is
    checked here; whether it is there, before anything starts (`core.device.resolve_device`)."""
    precision: str = "fp32"
    """`bf16`: forward and backward under bf16 autocast (faster on accelerators); weights and optimizer
    state stay fp32, and so do the outer state and what islands exchange."""
    shard: str = "replicate"
    """Under torchrun: `replicate` (DDP, the whole model on every rank) or `fsdp` (FSDP2, a shard each)."""
    compile: str = "auto"
    """One of `COMPILES` (`core.inner.InnerLoop`: a failed compilation falls back to eager, said once)."""

    def __post_init__(self) -> None:
        s = "train"
        _require(isinstance(self.device, str) and re.fullmatch(DEVICE_RE, self.device) is not None, s, "device",
                 f"one of {DEVICES_HELP}", self.device)
        _require(self.precision in PRECISIONS, s, "precision", f"one of {PRECISIONS}", self.precision)
        _require(self.shard in SHARDS, s, "shard", f"one of {SHARDS}", self.shard)
        _require(self.compile in COMPILES, s, "compile", f"one of {COMPILES}", self.compile)
        _require(self.batch_size >= 1, s, "batch_size", ">= 1", self.batch_size)
        _require(isinstance(self.threads, int) and 1 <= self.threads <= 1024, s, "threads", "in [1, 1024]", self.threads)
        _require(0 < self.lr <= 1, s, "lr", "in (0, 1]", self.lr)
        _require(0 <= self.min_lr_ratio <= 1, s, "min_lr_ratio", "in [0, 1]", self.min_lr_ratio)
        _require(self.warmup_steps >= 0, s, "warmup_steps", ">= 0", self.warmup_steps)
        _require(self.total_steps >= 1, s, "total_steps", ">= 1", self.total_steps)
        _require(self.weight_decay >= 0, s, "weight_decay", ">= 0", self.weight_decay)
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, s, "beta1/beta2", "in [0, 1)", (self.beta1, self.beta2))
        _require(self.grad_clip >= 0, s, "grad_clip", ">= 0", self.grad_clip)


@dataclass(frozen=True, kw_only=True)
class DiLoCoConfig:
    """The outer loop: rounds of H inner steps, gossip mixing, outer Nesterov step."""

    local_steps: int = 15
    """H: inner steps per round (a slow island may do fewer within `round_seconds`); the bytes an
    island sends per token fall with H (BENCHMARKS.md, "Simulator")."""
    round_seconds: float | None = None
    """Wall-clock budget of one round's inner steps; None means H steps whatever they take."""
    outer_lr: float = 0.7
    """Outer Nesterov learning rate (BENCHMARKS.md, "Simulator")."""
    outer_momentum: float = 0.5
    """Outer Nesterov momentum mu (BENCHMARKS.md, "Simulator")."""
    momentum: str = "rescaled-int4"
    """How outer momentum travels (`core.modes.Momentum`): `rescaled-int4` (default) publishes it in
    4 bits beside the weights, mixes it with the partner's weight and rescales it to the
    interpolated norm of the two buffers; `rescaled-sign` the same in signs with one magnitude per
    block; `local` keeps each island's own (BENCHMARKS.md, "Momentum that travels")."""
    mix_weight: float = 0.5
    """Base weight of a partner's state when both have equal tokens and no staleness."""
    token_weighting: bool = True
    """Scale the partner's weight by its share of tokens (a fresh joiner counts less)."""
    max_token_ratio: float = 3.0
    """A partner's claimed tokens count as at most this many times ours (its weight stays <= 0.75)."""
    max_version_jump: int = 4
    """Mixing raises the version by at most this: a resumed island catches up a few versions per
    mix, while a false claim moves an honest island by at most this much."""
    max_staleness: int = 8
    """A partner more than this many versions behind is skipped."""
    staleness_decay: float = 0.5
    """Slope d of the staleness discount 1 - d x - (1-d) x^2, x = lag / (max_staleness+1): smooth to 0."""
    final_mix: bool = True
    """When the island's budget is spent, fetch one partner's last state and mix it before the
    final checkpoint (one more fetch per run; BENCHMARKS.md, "The final mix")."""
    exchange: str = "auto"
    """What an island fetches: `auto` (whole states, updates or their fragments, whichever fits the link it
    measures: `core.linkfit`), whole `state`s, `updates` of a public state that follows its anchor with
    error feedback (`core.public`: from the ring successor, momentum local), or them in `fragments`."""
    update_codec: str = "sign"
    """Codec of the updates with `exchange="updates"`: `sign` or `int4` (`UPDATE_CODECS`)."""
    fragments: int = 4
    """With `exchange="fragments"`: each update covers one of this many spans in turn (`core.public`)."""
    offload_outer: bool = False
    """Keep the anchor and outer momentum in host memory instead of on the accelerator, as OpenDiLoCo does,
    to save accelerator memory (two more fp32 copies of the model); mixing and the outer step then run on the host."""

    def __post_init__(self) -> None:
        s = "diloco"
        _require(self.local_steps >= 1, s, "local_steps", ">= 1", self.local_steps)
        _require(self.round_seconds is None or self.round_seconds > 0, s, "round_seconds", "> 0 or unset", self.round_seconds)
        _require(0 < self.outer_lr <= 2, s, "outer_lr", "in (0, 2]", self.outer_lr)
        _require(0 <= self.outer_momentum < 1, s, "outer_momentum", "in [0, 1)", self.outer_momentum)
        _require(self.momentum in MOMENTUM_MODES, s, "momentum", f"one of {MOMENTUM_MODES}", self.momentum)
        _require(self.exchange in EXCHANGES and self.update_codec in UPDATE_CODECS, s, "exchange/update_codec",
                 f"in {EXCHANGES} and {UPDATE_CODECS}", (self.exchange, self.update_codec))
        _require(type(self.fragments) is int and 1 <= self.fragments <= MAX_FRAGMENTS, s, "fragments", f"an integer in [1, {MAX_FRAGMENTS}]", self.fragments)
        _require(0 < self.mix_weight <= 1, s, "mix_weight", "in (0, 1]", self.mix_weight)
        _require(self.max_staleness >= 0, s, "max_staleness", ">= 0", self.max_staleness)
        _require(self.max_token_ratio >= 1 and self.max_version_jump >= 0, s, "max_token_ratio/max_version_jump",
                 ">= 1 and >= 0", (self.max_token_ratio, self.max_version_jump))
        _require(0 <= self.staleness_decay <= 1, s, "staleness_decay", "in [0, 1]", self.staleness_decay)
        _require(isinstance(self.offload_outer, bool), s, "offload_outer", "true or false", self.offload_outer)
        _require(isinstance(self.final_mix, bool), s, "final_mix", "true or false", self.final_mix)


_RUN_ID_RE = r"^[A-Za-z0-9_-]{1,64}$"


@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    """How an island finds the swarm: run id, bootstrap addresses, back-end, record lifetimes."""

    run_id: str = "default"
    """Name of the training run; runs sharing one DHT or rendezvous never see each other's islands."""
    bootstrap: tuple[str, ...] = ()
    """Entry points: DHT multiaddrs (/ip4/H/tcp/P/p2p/ID) and/or rendezvous addresses (tcp://H:P)."""
    discovery: str = "auto"
    """`dht`, `zmq`, or `auto` (the DHT when a multiaddr is given and libp2p starts, else ZeroMQ)."""
    expiry: float = 30.0
    """Seconds a record stays visible without a refresh (how long a crashed island lingers)."""
    refresh: float = 5.0
    """Seconds between re-stores of the own record; must be below `expiry`."""
    poll: float = 1.0
    """Seconds between reads of the member list."""
    host: str = "127.0.0.1"
    """Address this island's sockets listen on: the state exchange's and discovery's (0.0.0.0 for all
    interfaces)."""
    port: int = 0
    """Port of this island's DHT node (0: any free port)."""
    px_port: int = 0
    """Port of this island's ZeroMQ peer-exchange socket, `--discovery zmq` (0: any free port)."""
    outbound_only: bool = False
    """Others cannot dial this island: its DHT node is a client, no peer-exchange socket is bound or announced."""
    announce_host: str | None = None
    """Address others should dial to reach this island (defaults to `host`; needed when host is 0.0.0.0)."""
    connect_timeout: float = 10.0
    """Seconds one attempt waits for any bootstrap address to answer (an observer, `status`, gives up
    after one attempt)."""
    join_timeout: float | None = None
    """Seconds an island keeps trying bootstrap nodes that do not answer, with backoff and jitter,
    before it gives up (`[discovery] join_timeout`); unset: until one answers, the island's `max_seconds`
    pass, or it is stopped (`p2p_diloco.discovery.patience`). Not `IslandConfig.join_timeout_s`,
    which bounds the wait for members and the first download once discovery answered."""
    secret: str | None = dataclasses.field(default=None, repr=False)
    """Swarm secret: records are sealed with a key derived from it, so only its holders can list or
    add members (`p2p_diloco.discovery.sealing`), and the state exchange's CurveZMQ keys are derived
    from it, so only they can fetch or push state (`p2p_diloco.exchange.sockets`)."""

    def __post_init__(self) -> None:
        s = "discovery"
        _require(isinstance(self.run_id, str) and re.match(_RUN_ID_RE, self.run_id) is not None, s, "run_id",
                 "1-64 characters of [A-Za-z0-9_-]", self.run_id)
        if isinstance(self.bootstrap, (list, str)):
            object.__setattr__(self, "bootstrap", tuple([self.bootstrap] if isinstance(self.bootstrap, str) else self.bootstrap))
        for addr in self.bootstrap:
            try:
                addresses.parse(addr)
            except ValueError as e:
                raise ConfigError(f"discovery.bootstrap: {e}") from e
        _require(self.discovery in DISCOVERY_KINDS, s, "discovery", f"one of {DISCOVERY_KINDS}", self.discovery)
        _require(1.0 <= self.expiry <= 3600.0, s, "expiry", "in [1, 3600] seconds", self.expiry)
        _require(0.05 <= self.refresh < self.expiry, s, "refresh", "at least 0.05 s and below expiry", self.refresh)
        _require(0.05 <= self.poll <= self.expiry, s, "poll", "at least 0.05 s and at most expiry", self.poll)
        _require(isinstance(self.host, str) and 0 < len(self.host) <= 253, s, "host", "a host name or address", self.host)
        for name, v in (("port", self.port), ("px_port", self.px_port)):
            _require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535, s, name, "in [0, 65535]", v)
        _require(self.px_port == 0 or self.px_port != self.port, s, "px_port", "0 or other than port", self.px_port)
        _require(isinstance(self.outbound_only, bool) and (not self.outbound_only or len(self.bootstrap) > 0), s,
                 "outbound_only", "a bool, True only with a bootstrap address (nobody can dial in to join)",
                 self.outbound_only)
        _require(self.announce_host is None or (isinstance(self.announce_host, str) and 0 < len(self.announce_host) <= 253),
                 s, "announce_host", "unset or a host name or address", self.announce_host)
        _require(self.announce_host is not None or self.host not in ("0.0.0.0", "::"), s, "announce_host",
                 "set when host is a wildcard address (others cannot dial 0.0.0.0)", self.announce_host)
        _require(0 < self.connect_timeout <= 600, s, "connect_timeout", "in (0, 600] seconds", self.connect_timeout)
        t = self.join_timeout
        _require(t is None or (not isinstance(t, bool) and isinstance(t, (int, float)) and t > 0), s, "join_timeout",
                 "> 0 seconds or unset", t)
        _require(self.secret is None or (isinstance(self.secret, str) and len(self.secret) > 0), s, "secret",
                 "unset or a non-empty string", "<hidden>")

    @property
    def visible_host(self) -> str:
        """The host others dial to reach this island."""
        return self.announce_host or self.host


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """The state exchange over ZeroMQ: payload codec, chunking, upload cap, link emulation (the swarm
    secret that keys it is `DiscoveryConfig.secret`)."""

    compression: str = "int8"
    """Codec of the published anchor: fp32 (lossless), bf16, fp16, int8 (per-block scales, the default)
    or int4 (BENCHMARKS.md, "Codecs")."""
    min_chunk_bytes: int = 64 * 1024
    """Smallest chunk a fetcher asks for (the protocol allows 64 KiB to 8 MiB)."""
    max_chunk_bytes: int = 8 * 1024 * 1024
    """Largest chunk a fetcher asks for (at most 8 MiB)."""
    initial_window_bytes: int = 8 * 1024 * 1024
    """Bytes in flight on a link not measured yet; then the window follows 2 x bandwidth x RTT."""
    max_window_bytes: int = 64 * 1024 * 1024
    """Most bytes in flight per fetch: bounds a fetcher's memory beyond the state itself."""
    max_upload_mbps: float | None = None
    """Cap on all the snapshot server sends, in Mbit/s (None: no cap)."""
    fetch_timeout_s: float = 10.0
    """A fetch fails with TransportTimeout when the peer sends nothing for this long (a stalled
    partner costs the island's gossip this long, and then only that exchange)."""
    max_state_bytes: int = 16 * 1024**3
    """A manifest announcing more decoded fp32 state than this is refused before allocating."""
    retain_snapshots: int = 2
    """Snapshots a server keeps serving: the newest plus older ones that fetches may still be reading."""

    def __post_init__(self) -> None:
        s, lo, hi = "network", 64 * 1024, 8 * 1024 * 1024
        _require(self.compression in CODECS, s, "compression", f"one of {CODECS}", self.compression)
        _require(isinstance(self.min_chunk_bytes, int) and lo <= self.min_chunk_bytes <= hi, s, "min_chunk_bytes",
                 f"in [{lo}, {hi}]", self.min_chunk_bytes)
        _require(isinstance(self.max_chunk_bytes, int) and self.min_chunk_bytes <= self.max_chunk_bytes <= hi, s,
                 "max_chunk_bytes", f"in [min_chunk_bytes, {hi}]", self.max_chunk_bytes)
        _require(isinstance(self.initial_window_bytes, int) and self.initial_window_bytes >= self.min_chunk_bytes, s,
                 "initial_window_bytes", ">= min_chunk_bytes", self.initial_window_bytes)
        _require(isinstance(self.max_window_bytes, int) and self.max_window_bytes >= self.initial_window_bytes, s,
                 "max_window_bytes", ">= initial_window_bytes", self.max_window_bytes)
        _require(self.max_upload_mbps is None or self.max_upload_mbps > 0, s, "max_upload_mbps", "> 0 or unset",
                 self.max_upload_mbps)
        _require(0 < self.fetch_timeout_s <= 3600, s, "fetch_timeout_s", "in (0, 3600] seconds", self.fetch_timeout_s)
        _require(isinstance(self.max_state_bytes, int) and self.max_state_bytes > 0, s, "max_state_bytes", "> 0",
                 self.max_state_bytes)
        _require(isinstance(self.retain_snapshots, int) and 1 <= self.retain_snapshots <= 8, s, "retain_snapshots",
                 "in [1, 8]", self.retain_snapshots)


@dataclass(frozen=True, kw_only=True)
class IslandConfig:
    """The island process's own settings (the rest lives in the shared config sections)."""

    run_dir: Path = Path("runs/island")
    """Metrics, checkpoints and the island's log live here."""
    port: int = 0
    """Snapshot server port (0: any free port); it listens on `DiscoveryConfig.host` and is dialled
    at `DiscoveryConfig.visible_host`."""
    reach: str = "auto"
    """One of `REACH_MODES`: whether others can dial this island (outbound: fetch and push only)."""
    max_tokens: int | None = None
    """Stop after this island trained this many tokens."""
    max_rounds: int | None = None
    """Stop after this many rounds."""
    max_seconds: float | None = None
    """Stop after this many seconds of training."""
    resume: bool = False
    """Continue from the last checkpoint in `run_dir` (an error if there is none or it is corrupt)."""
    fresh: bool = False
    """Start afresh in a `run_dir` that holds an earlier run's checkpoints, moved aside into its
    `previous-<time>/` (without it, or `resume`, such a directory is an error: `peers.state.rundir`)."""
    checkpoint_every: int = 10
    """Rounds between checkpoints (one is always written on exit)."""
    eval_every: int = 10
    """Rounds between held-out evaluations (also one at the end)."""
    eval_batches: int = 4
    join_timeout_s: float = 20.0
    """How long a joiner tries to download the freshest member's state before starting on its own,
    and the longest it waits for `wait_for` islands."""
    same_version_wait: float = 0.4
    """For this share of the previous round's inner-step time, a round fetches only from a partner
    that was not one of its last two and has reached this island's version or is one behind, and
    the fetch waits (asking the partner, a round trip at a time) until it publishes this version;
    when the wait ends it takes what the partner has, and a round that found no such partner by
    then takes any. Islands are never exactly in phase, so at a round's start some partners have
    not yet published this version, and a state one version older weighs less and pulls the
    island back; the first to publish it would be the same partner every round, and discovery
    shows a publish a second or two late (BENCHMARKS.md, "Swarm")."""
    max_stretch: float = 0.5
    """An island that runs ahead of most others trains on past its H steps, by up to this share of
    H, until its round ends with theirs (`p2p_diloco.peers.rounds.pacing`); it never idles, and a round never passes
    `round_seconds` or the token budget. 0 turns it off."""
    wait_for: int = 1
    """Before its first round, wait until this many islands (this one included) are in the run: islands
    launched together then start their rounds together instead of seconds apart."""
    name: str | None = None
    """The island's name in logs, progress lines, its discovery record, `status` and the dashboard
    (default: its peer id's first 8 characters): at most `MAX_NAME_CHARS` printable ASCII characters."""
    quiet: bool = False
    """No progress lines on stderr."""

    def __post_init__(self) -> None:
        s = "island"
        _require(isinstance(self.run_dir, (str, Path)) and str(self.run_dir) != "", s, "run_dir", "a folder path",
                 self.run_dir)
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        for name in ("max_tokens", "max_rounds", "max_seconds", "checkpoint_every", "eval_every", "eval_batches",
                     "wait_for"):
            v = getattr(self, name)
            _require((v is None and name.startswith("max_")) or (not isinstance(v, bool) and v > 0), s, name,
                     "> 0" + (" or unset" if name.startswith("max_") else ""), v)
        _require(0 <= self.port <= 65535, s, "port", "in [0, 65535]", self.port)
        _require(self.reach in REACH_MODES, s, "reach", f"one of {REACH_MODES}", self.reach)
        _require(not (self.resume and self.fresh), s, "fresh", "off with resume (continue the run or start afresh)", self.fresh)
        _require(self.name is None or valid_name(self.name), s, "name",
                 f"unset or 1-{MAX_NAME_CHARS} printable ASCII characters (no space at either end)", self.name)
        _require(0.0 <= self.same_version_wait <= 1.0 and 0.0 <= self.max_stretch <= 1.0, s,
                 "same_version_wait/max_stretch", "in [0, 1]", (self.same_version_wait, self.max_stretch))


def to_toml(tables: dict[str, dict[str, Any]]) -> str:
    """Config sections as the text of a `--config FILE` (`{"model": {"n_layer": 2}, ...}`): for the
    processes a command starts with settings that have no flag (the demo's and the tests' islands)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (str, Path)):
            return json.dumps(str(v))  # a JSON string is a TOML basic string
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise ConfigError(f"{v!r} cannot be written to a config file")

    return "".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items())
                   for name, table in tables.items() if table)
