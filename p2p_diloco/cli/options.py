"""click options and helpers shared by the commands: one decorator per group of options.

Every option that sets a config field takes its default from that field (`p2p_diloco.config`), so
a default is written once; lists of choices come from the config's constants. Only click and the
torch-free config are imported here, so `p2p-diloco --help` stays instant.

`join`, `status` and the dashboard take the same `--bootstrap` (repeatable), `--run-id` and
`--discovery` (`discovery_options`); the environment variables `P2P_DILOCO_BOOTSTRAP`
(space-separated), `P2P_DILOCO_RUN_ID` and `P2P_DILOCO_DISCOVERY` apply to all of them. They also
take the swarm secret the same way (`secret_options`: `--secret`, `--secret-file`,
`P2P_DILOCO_SECRET`, `P2P_DILOCO_SECRET_FILE`); a file or the environment keeps it out of argv,
which `ps` shows to every user of the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from typing import Any, Callable, Iterator

import click

from p2p_diloco.config import (
    CODECS, DEVICE_RE, DEVICES_HELP, DISCOVERY_KINDS, EXCHANGES, LLAMA_PRESETS, MODEL_PRESETS, MOMENTUM_MODES, PRECISIONS,
    UPDATE_CODECS, DiLoCoConfig, DiscoveryConfig, ModelConfig, NetworkConfig, TrainConfig
)
from p2p_diloco.errors import ConfigError, DataError, DeviceError, P2PDiLoCoError

D, M, N, T = DiLoCoConfig, ModelConfig, NetworkConfig, TrainConfig


def csv(kind: type) -> Callable:
    """click callback: parse a comma-separated list into a tuple of `kind`."""

    def parse(_ctx, param, value):
        if value is None or isinstance(value, tuple):
            return value
        try:
            return tuple(kind(v.strip()) for v in str(value).split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(f"expected a comma-separated list: {e}", param=param) from e

    return parse


class BadSetting(click.ClickException):
    """A setting this machine cannot run, a config value out of range or data that cannot be read: one
    line, exit code 2 like any bad option value."""

    exit_code = 2


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """The project's own errors become readable click errors (no traceback): exit code 2 for a bad
    setting (an unusable device, a config value out of range, data that cannot be read), 1 for the
    rest (failures at run time)."""
    try:
        yield
    except (DeviceError, ConfigError, DataError) as e:
        raise BadSetting(str(e)) from e
    except P2PDiLoCoError as e:
        raise click.ClickException(str(e)) from e


def echo_result(out: dict, as_json: bool, table: Callable[[dict], list[str]]) -> None:
    """A bench's result: one JSON object, or the lines of its `table`."""
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in table(out):
        click.echo(line)


class GroupedCommand(click.Command):
    """A command whose `--help` lists its options under headings (`groups`: heading -> parameter
    names, in order); options in no group come last, under "Other options"."""

    groups: dict[str, tuple[str, ...]] = {}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        rows = {"help" if p is help_option else p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        rows = {name: row for name, row in rows.items() if row is not None}
        placed: set[str] = set()
        for heading, names in self.groups.items():
            group = [rows[n] for n in names if n in rows]
            placed.update(names)
            if group:
                with formatter.section(heading):
                    formatter.write_dl(group)
        rest = [row for name, row in rows.items() if name not in placed]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)


def grouped(groups: dict[str, tuple[str, ...]]) -> type[GroupedCommand]:
    """A `GroupedCommand` class with these `groups`, for `@click.command(cls=...)`."""
    return type("Grouped", (GroupedCommand,), {"groups": groups})


def codec_option(default: str = N.compression, help: str = "Codec of every exchanged state.") -> Callable:
    return click.option("--compression", type=click.Choice(CODECS), default=default, show_default=True, help=help)


def data_options(f: Callable) -> Callable:
    """`--data` and `--vocab-size`, alike on `join`, `demo` and `simulate`."""
    # --help lists the option applied last first: --vocab-size shows right after --data
    f = click.option("--vocab-size", type=click.IntRange(min=2), default=None,
                     help="Vocabulary of token shards, e.g. 50257 for GPT-2's tokenizer (default: from the folder's "
                          "dataset.json, written by `prepare`, or the shard header; text is always bytes, 256).")(f)
    return click.option("--data", type=click.Path(), default=None,
                        help="Text file or folder of text files, or .bin token shards (a file or a folder) "
                             "(default: this Python's standard-library sources).")(f)


def model_choice(_ctx, param, value: str | None) -> str | None:
    """`--model`: a preset's name or a path ending in .json (`ModelConfig.size`; the file is read there)."""
    if value is None or value in MODEL_PRESETS or value in LLAMA_PRESETS or value.endswith(".json"):
        return value
    raise click.BadParameter(f"{value!r} is neither a preset ({', '.join([*MODEL_PRESETS, *LLAMA_PRESETS])}) nor "
                             "a config.json", param=param)


def model_options(f: Callable) -> Callable:
    """Options shared by every command that builds a model and reads data."""
    f = click.option("--model", "model_size", callback=model_choice, default=M.size, show_default=True,
                     metavar="PRESET|CONFIG.json",
                     help=f"Model preset: the project's GPT ({', '.join(MODEL_PRESETS)}), a Llama "
                          f"({', '.join(LLAMA_PRESETS)}; needs transformers), or a Hugging Face config.json of any "
                          "causal LM (Llama, Qwen2, Mistral, GPT-2...), built from it: nothing is downloaded.")(f)
    f = data_options(f)
    f = click.option("--batch-size", type=int, default=T.batch_size, show_default=True, help="Sequences per inner step.")(f)
    f = click.option("--lr", type=float, default=T.lr, show_default=True, help="Peak inner AdamW learning rate.")(f)
    return f


def model_shape_options(f: Callable) -> Callable:
    """The preset's shape, overridden (`simulate`; `join` takes them from the config file's [model] table)."""
    f = click.option("--n-layer", type=int, default=M.n_layer, help="Override the preset's number of blocks.")(f)
    f = click.option("--n-embd", type=int, default=M.n_embd, help="Override the preset's width.")(f)
    f = click.option("--n-head", type=int, default=M.n_head, help="Override the preset's attention heads.")(f)
    return click.option("--block-size", type=int, default=M.block_size, help="Override the preset's context length.")(f)


REMOVED_MODES = "its figures are in docs/HISTORY.md, 'Modes removed'"
RETIRED_MOMENTUM = {name: "use rescaled-int4 (the default), rescaled-sign or local" for name in (
    "mixed", "mixed-int4", "alternate", "alternate-int4", "same-version", "rescaled", "partner-delta", "noloco")}
RETIRED_UPDATE_CODECS = {name: "updates travel in sign or int4" for name in ("topk", "lowrank")}


class Retiring(click.Choice):
    """A `click.Choice` that answers a removed value with one line naming its replacement."""

    def __init__(self, choices, retired: dict[str, str]) -> None:
        super().__init__(choices)
        self.retired = retired

    def convert(self, value, param, ctx):
        if value in self.retired:
            self.fail(f"{value!r} was removed: {self.retired[value]} ({REMOVED_MODES})", param, ctx)
        return super().convert(value, param, ctx)


def retired_option(decl: str, replacement: str, figures: bool = True, status: str = "was removed", **kw: Any) -> Callable:
    """A removed option, hidden: given on the command line or in a config file, it is a one-line
    usage error naming its replacement (and, for a removed mode, where its figures are), instead of
    click's bare "no such option"."""

    def refuse(_ctx, param, value):
        if value is not None:
            raise click.UsageError(f"{param.opts[0]} {status}: {replacement}" + (f" ({REMOVED_MODES})" if figures else ""))

    return click.option(decl, default=None, hidden=True, expose_value=False, callback=refuse, **kw)


def diloco_options(update_codec: bool = True) -> Callable[[Callable], Callable]:
    """Options of the outer loop, shared by `simulate` and `join` (which takes the update codec from
    the config file's [diloco] table: `update_codec=False`)."""
    return lambda f: _diloco_options(f, update_codec)


def _diloco_options(f: Callable, update_codec: bool) -> Callable:
    f = click.option("--local-steps", "-H", type=int, default=D.local_steps, show_default=True, help="H: inner steps per round.")(f)
    f = click.option("--momentum", type=Retiring(MOMENTUM_MODES, RETIRED_MOMENTUM), default=D.momentum,
                     show_default=True, help="How outer momentum travels: in 4 bits, mixed and rescaled (the default), "
                                             "in signs, or kept local (docs/DESIGN.md, section 2.2).")(f)
    f = click.option("--exchange", type=click.Choice(EXCHANGES), default=D.exchange, show_default=True,
                     help="auto: fetch whole states while one moves in a small share of a round at the measured "
                          "rate, else compressed updates of a public state, in fragments where even those do not fit; "
                          "state, updates or fragments: always that (updates: error feedback, the ring of peer ids "
                          "picks partners, momentum stays local; fragments: [diloco] fragments spans, one per update).")(f)
    if update_codec:
        f = click.option("--update-codec", type=Retiring(UPDATE_CODECS, RETIRED_UPDATE_CODECS), default=D.update_codec,
                         show_default=True, help="Codec of the updates (--exchange updates or auto).")(f)
    f = retired_option("--mix-at", "a partner's state is always mixed as it arrives; drop --mix-at")(f)
    f = retired_option("--mix-pseudo-gradient/--no-mix-pseudo-gradient",
                       "pseudo-gradients are never averaged; drop the option")(f)
    return f


def outer_step_options(f: Callable) -> Callable:
    """The outer step's settings as options (`simulate`, for measuring them; `join` takes them from the
    config file's [diloco] table)."""
    f = click.option("--outer-lr", type=float, default=D.outer_lr, show_default=True, help="Outer Nesterov learning rate.")(f)
    f = click.option("--outer-momentum", type=float, default=D.outer_momentum, show_default=True, help="Outer Nesterov momentum.")(f)
    return click.option("--final-mix/--no-final-mix", default=D.final_mix, show_default=True,
                        help="When the budget is spent, mix one partner's last state before the final checkpoint.")(f)


def gossip_tuning_options(f: Callable) -> Callable:
    """The mixing weight and staleness cut-off as options (`simulate`, for measuring them; `join` takes
    them from the config file's [diloco] table)."""
    f = click.option("--mix-weight", type=float, default=D.mix_weight, show_default=True,
                     help="Partner weight at equal tokens and no staleness.")(f)
    f = click.option("--max-staleness", type=int, default=D.max_staleness, show_default=True,
                     help="Skip partners more than this many versions behind.")(f)
    return f


def config_file_option(flag: str, section: str, field: str | None = None) -> Callable:
    """A flag `join` does not take: `field` (default: the flag's name) is set in the config file's
    `[section]` table."""
    field = field or flag[2:].replace("-", "_")
    return retired_option(flag, f"set {field} in its [{section}] table (p2p-diloco --config FILE join ...)",
                          figures=False, status="is set in a config file only")


def device_spec(_ctx, param, value: str) -> str:
    """click callback: a malformed --device is a usage error naming the accepted forms (availability is
    checked later, when the command resolves it)."""
    if value is not None and re.fullmatch(DEVICE_RE, value) is None:
        raise click.BadParameter(f"{value!r} is not a device; use one of {DEVICES_HELP}", param=param)
    return value


def device_options(f: Callable) -> Callable:
    """`--device` and `--precision`: where training runs and in which precision (applied last to first,
    so `--help` lists them in this order)."""
    f = click.option("--precision", type=click.Choice(PRECISIONS), default=T.precision, show_default=True,
                     help="bf16: forward and backward under bf16 autocast; weights and optimizer state stay fp32.")(f)
    return click.option("--device", default=T.device, show_default=True, callback=device_spec, metavar="DEVICE",
                        help="Where the model, inner optimizer and outer state live: auto (CUDA when available), cpu, "
                             "cuda, cuda:N, mps.")(f)


def offload_option(f: Callable) -> Callable:
    """`--offload-outer` (`simulate`, `demo`; `join` takes it from the config file's [diloco] table)."""
    return click.option("--offload-outer/--no-offload-outer", default=D.offload_outer, show_default=True,
                        help="Keep the anchor and outer momentum in host memory (saves accelerator memory).")(f)


def secret_options(help: str) -> Callable:
    """`--secret` and `--secret-file` (listed in this order): the swarm secret, or a file holding it."""

    def decorate(f: Callable) -> Callable:
        f = click.option("--secret-file", type=click.Path(dir_okay=False), default=None, envvar="P2P_DILOCO_SECRET_FILE",
                         help="File holding the swarm secret (surrounding whitespace stripped): unlike --secret, it "
                              "stays out of argv, which `ps` shows to every user.")(f)
        return click.option("--secret", default=None, envvar="P2P_DILOCO_SECRET", help=help)(f)

    return decorate


def read_secret_file(path: str) -> str:
    """The secret in `path`, stripped of surrounding whitespace; a one-line usage error when the file
    is missing, unreadable or empty, and a one-line warning when group or others may read it."""
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as f:
            secret = f.read(1 << 16).decode().strip()
    except FileNotFoundError:
        raise click.BadParameter(f"{path} does not exist", param_hint="--secret-file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {getattr(e, 'strerror', None) or e}",
                                 param_hint="--secret-file") from None
    if not secret:
        raise click.BadParameter(f"{path} is empty", param_hint="--secret-file")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        click.echo(f"Warning: the secret file {path} is accessible to group or others (mode {stat.S_IMODE(mode):o}); "
                   f"chmod 600 it", err=True)
    return secret


def resolve_secret(secret: str | None, secret_file: str | None) -> str | None:
    """The swarm secret from `--secret` or `--secret-file`. Both given at the same level (both flags,
    or both variables) is a usage error; otherwise the flag beats the environment variable."""
    if secret is None or secret_file is None:
        return read_secret_file(secret_file) if secret_file is not None else secret
    ctx = click.get_current_context(silent=True)
    sources = [ctx.get_parameter_source(name) if ctx else None for name in ("secret", "secret_file")]
    if None in sources or sources[0] == sources[1]:
        raise click.UsageError("--secret and --secret-file (or P2P_DILOCO_SECRET and P2P_DILOCO_SECRET_FILE) are "
                               "both given; pass one")
    return secret if sources[0].value < sources[1].value else read_secret_file(secret_file)


def swarm_secret(kw: dict) -> str | None:
    """The swarm secret of parsed `secret_options` (`resolve_secret`; pops both), for the state
    exchange and discovery alike (`DiscoveryConfig.secret`)."""
    return resolve_secret(kw.pop("secret", None), kw.pop("secret_file", None))


def build_configs(kw: dict) -> tuple[ModelConfig, TrainConfig, DiLoCoConfig]:
    """Turn parsed model/train/outer options into validated config dataclasses (pops what it uses; a
    command without an option gets the field's default)."""
    model = ModelConfig(size=kw.pop("model_size"), n_layer=kw.pop("n_layer", None), n_embd=kw.pop("n_embd", None),
                        n_head=kw.pop("n_head", None), block_size=kw.pop("block_size", None))
    train = TrainConfig(batch_size=kw.pop("batch_size"), lr=kw.pop("lr"), seed=kw.get("seed", T.seed),
                        device=kw.pop("device", T.device), precision=kw.pop("precision", T.precision),
                        shard=kw.pop("shard", T.shard))
    diloco = DiLoCoConfig(local_steps=kw.pop("local_steps"), outer_lr=kw.pop("outer_lr", D.outer_lr),
                          outer_momentum=kw.pop("outer_momentum", D.outer_momentum), momentum=kw.pop("momentum"),
                          final_mix=kw.pop("final_mix", D.final_mix), mix_weight=kw.pop("mix_weight", D.mix_weight),
                          max_staleness=kw.pop("max_staleness", D.max_staleness),
                          offload_outer=kw.pop("offload_outer", D.offload_outer), exchange=kw.pop("exchange"),
                          update_codec=kw.pop("update_codec", D.update_codec), fragments=kw.pop("fragments", D.fragments))
    return model, train, diloco


def discovery_options(required: bool = False) -> Callable:
    """`--bootstrap`, `--run-id` and `--discovery` in one decorator."""
    bootstrap = click.option(
        "--bootstrap", "bootstrap", multiple=True, required=required, default=DiscoveryConfig.bootstrap, metavar="ADDR",
        envvar="P2P_DILOCO_BOOTSTRAP",
        help="Bootstrap address, repeatable: the /ip4/.../p2p/... multiaddr or the tcp://HOST:PORT rendezvous "
             "that `p2p-diloco bootstrap` prints. Joining works if any of them answers.",
    )
    run_id = click.option("--run-id", default=DiscoveryConfig.run_id, show_default=True, envvar="P2P_DILOCO_RUN_ID",
                          help="Name of the training run (runs sharing a bootstrap node never see each other).")
    kind = click.option("--discovery", type=click.Choice(DISCOVERY_KINDS), default=DiscoveryConfig.discovery,
                        show_default=True, envvar="P2P_DILOCO_DISCOVERY",
                        help="dht: hivemind DHT; zmq: ZeroMQ rendezvous and peer exchange (no libp2p); "
                             "auto: the DHT, or ZeroMQ with a warning when the libp2p daemon cannot start.")

    def decorate(f: Callable) -> Callable:
        return bootstrap(run_id(kind(f)))

    return decorate


def discovery_config(bootstrap: tuple[str, ...], run_id: str, discovery: str, **fields: Any) -> DiscoveryConfig:
    """A validated `DiscoveryConfig`; a bad value becomes a click usage error."""
    try:
        return DiscoveryConfig(bootstrap=tuple(bootstrap), run_id=run_id, discovery=discovery, **fields)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
