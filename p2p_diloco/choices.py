"""The names each setting accepts: codecs, momentum modes, model presets and the like.

Plain constants (no torch), imported by the config sections (`p2p_diloco.config`, which also makes
them available under its own name) and by whatever validates or lists them.
"""

from __future__ import annotations

MOMENTUM_MODES = ("rescaled-int4", "rescaled-sign", "local")
"""How outer momentum travels (`p2p_diloco.core.modes.Momentum`)."""
EXCHANGES = ("auto", "state", "updates", "fragments")
"""What an island sends: whichever fits the measured link, its whole state, updates of a public state,
or updates of one fragment of it at a time (`p2p_diloco.core.modes.Exchange`)."""
MAX_FRAGMENTS = 16
"""The most fragments an update of a public state is cut into (`p2p_diloco.core.public.fragment`)."""
UPDATE_CODECS = ("sign", "int4")
"""Codecs a public state's updates travel in (`p2p_diloco.core.public`)."""
CODECS = ("fp32", "bf16", "fp16", "int8", "int4")
"""Payload codecs of exchanged state (`p2p_diloco.core.codecs` implements them)."""
WIRE_CODECS = (*CODECS, "sign")
"""What a tensor of a snapshot may travel in: an anchor's codecs, and `sign` for momentum and updates."""
DISCOVERY_KINDS = ("auto", "dht", "zmq")
"""Discovery back-ends: `auto` tries the DHT and falls back to ZeroMQ (`p2p_diloco.discovery`)."""
REACH_MODES = ("auto", "direct", "outbound")
"""Can others dial an island: auto (ask the bootstrap node), direct (yes), outbound (no: it fetches and pushes)."""
DHT_PORT_OFFSET, PX_PORT_OFFSET = 1, 2
"""`join --port P` (P != 0): the DHT listens on P+1 and the ZeroMQ peer exchange on P+2."""
DEVICES_HELP = "auto|cpu|cuda|cuda:N|mps"
"""The accepted `--device` forms (`p2p_diloco.core.device.resolve_device` resolves them)."""
DEVICE_RE = r"^(auto|cpu|mps|cuda(:\d+)?)$"
"""Syntax of a `--device` value (checked by `TrainConfig`, torch-free)."""
PRECISIONS = ("fp32", "bf16")
"""Precisions of the inner forward and backward pass (`p2p_diloco.core.device.autocast`)."""
COMPILES = ("auto", "on", "off")
"""`[train] compile`: `torch.compile` the model's training forward on CUDA only (auto), everywhere (on), never (off)."""
SHARDS = ("replicate", "fsdp")
"""How a torchrun island holds its model: whole on every rank (DDP) or sharded over them (FSDP2, `peers.torchrun.sharding`)."""
POISONS = ("nan", "scale", "random", "other-run", "momentum", "inflate", "stuck", "reverse", "noise", "claims",
           "momentum-x3", "drift", "alie", "ipm")
"""What a hostile test double publishes (`bench member --poison`, `p2p_diloco.bench.member`)."""
HONEST_MEMBERS = ("slow", "other-data")
"""Members of `bench attack` that differ from the others honestly: 10x slower, or on another corpus."""
MODEL_PRESETS: dict[str, dict[str, int]] = {
    # ~0.84M parameters: tests and CPU demos
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128},
    # ~10.8M parameters
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
    # GPT-2 small's shape: ~124M parameters at the GPT-2 vocabulary (50257), ~86M with bytes
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
    # ~1.01B parameters at the GPT-2 vocabulary: head size 128 (`bench gpu`'s large islands)
    "gpt2-1b": {"n_layer": 18, "n_head": 16, "n_embd": 2048, "block_size": 1024},
}
"""Named shapes of the project's GPT (`p2p_diloco.core.model`)."""
LLAMA_PRESETS: dict[str, dict[str, int]] = {
    # ~0.1M parameters at bytes: tests
    "llama-tiny": {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 128},
    # ~10.7M parameters at bytes (the `small` GPT's shape)
    "llama-small": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
    # ~152M parameters at the GPT-2 vocabulary (50257), ~113M with bytes
    "llama-150m": {"n_layer": 16, "n_head": 12, "n_embd": 768, "block_size": 1024},
}
"""Named shapes of a Llama (RoPE, RMSNorm, SwiGLU; `transformers.LlamaForCausalLM`, `p2p_diloco.core.hf`): tied
embeddings, as many key/value heads as heads, an MLP of 8/3 x n_embd rounded up to a multiple of 64."""
HF_CONTEXT = 1024
"""A model from a Hugging Face config.json trains on sequences of at most this many tokens (its position
limit if lower) unless `[model] block_size` says otherwise."""

MAX_NAME_CHARS = 32
"""The longest island name (`IslandConfig.name`, the `name` of its discovery record)."""


def valid_name(name: object) -> bool:
    """An island name: 1 to `MAX_NAME_CHARS` printable ASCII characters, not starting or ending with a space."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name.isascii() and name.isprintable()
            and name == name.strip())
