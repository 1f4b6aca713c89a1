"""`--config FILE`: a TOML file of settings, read before any command runs.

Two kinds of table:

- **Config sections** (`[model]`, `[train]`, `[diloco]`, `[network]`, `[discovery]`, `[island]`, `[log]`
  (`p2p_diloco.tracking`: `to`, the flag `--log-to`, and `wandb_project`), and
  `[admission]` with its settings sections `[admission.trust]`, ...: `p2p_diloco.admission`),
  named and keyed as the config dataclasses of `p2p_diloco.config` are: they configure `join`
  (and `bench member`). Every field can be set there, the ones with no flag too (the expert
  knobs: `diloco.token_weighting`, `island.same_version_wait`, `network.max_window_bytes`, ...).
- **Command tables** (`[join]`, `[simulate]`, `[bench.swarm]`, ...): defaults of that command's
  options, named as the flags are (`local-steps`) or as their parameters (`local_steps`).

Precedence: flag > environment variable (`P2P_DILOCO_<COMMAND>_<OPTION>`) > command table > config
section > the defaults. A misspelt table, section field or option is an error that names the
closest known one, never a setting silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib

import click

from p2p_diloco import config as cfg
from p2p_diloco.admission import AdmissionConfig
from p2p_diloco.errors import ConfigError
from p2p_diloco.tracking import LogConfig

ADVANCED = "p2p_diloco.advanced"
"""`ctx.meta` key: the file's section fields that no option sets, applied by `join` (`apply_advanced`)."""
SECTIONS = {"model": cfg.ModelConfig, "train": cfg.TrainConfig, "diloco": cfg.DiLoCoConfig,
            "network": cfg.NetworkConfig, "discovery": cfg.DiscoveryConfig, "island": cfg.IslandConfig,
            "admission": AdmissionConfig, "log": LogConfig}
"""Config sections a file may set, by table name (the names the configs' own errors use)."""
SECTION_COMMANDS = ("join", "bench.member")
"""The commands the config sections configure."""
OPTION_OF = {("model", "size"): "model_size", ("island", "port"): "port", ("discovery", "host"): "host",
             ("discovery", "announce_host"): "announce_host", ("log", "to"): "log_to"}
"""Section fields whose `join` option has another name (or whose name another section's option takes)."""


def load_toml(path: str) -> dict[str, dict]:
    """Read a TOML config file into `{table: {key: value}}` (`apply` checks the names)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e


LIST_AT_MOST = 24
"""An unknown name with no close match lists the known ones when there are at most this many."""


def _unknown(what: str, name: str, known: list[str], elsewhere: dict[str, str] | None = None) -> ConfigError:
    """`name` is not one of `known`: the same name in another table (`elsewhere`: names of other
    tables, shown as their value, `[train] warmup_steps`), else the closest of both, else the short
    list or where to look."""
    shown = {**(elsewhere or {}), **{k: repr(k) for k in known}}
    if close := [name] if elsewhere and name in elsewhere else _closest(name, list(shown)):
        hint = f"did you mean {' or '.join(shown[c] for c in close)}?"
    elif len(known) <= LIST_AT_MOST:
        hint = f"known: {', '.join(sorted(known))}"
    else:
        hint = f"none of the {len(known)} known names is close (the command's --help lists them)"
    return ConfigError(f"{what} {name!r} is unknown; {hint}")


def _closest(name: str, known: list[str]) -> list[str]:
    """The one of `known` closest to `name` in spelling (`-`, `_` and `.` alike, brackets aside), else
    at most two that share its longest word of three letters or more (`warmup` in `lr_warmup` and
    `warmup_steps`)."""
    def norm(s: str) -> str:
        return s.lower().strip("[]").replace("-", "_").replace(".", "_")

    by_norm = {norm(k): k for k in known}
    if close := difflib.get_close_matches(norm(name), list(by_norm), n=1):
        return [by_norm[close[0]]]
    for word in sorted((w for w in norm(name).split("_") if len(w) >= 3), key=len, reverse=True):
        sharing = [k for n, k in by_norm.items() if word in n.split("_")]
        if sharing:
            return sharing[:2]
    return []


def _fields_elsewhere(but: str | None = None) -> dict[str, str]:
    """Every config section's field (but those of section `but`), for `_unknown`'s `elsewhere`."""
    return {f.name: f"[{section}] {f.name}" for section, kind in SECTIONS.items() if section != but
            for f in dataclasses.fields(kind)}


def sections(tables: dict) -> tuple[dict, dict[str, dict]]:
    """Split the file's config sections from its command tables: (command tables, sections checked)."""
    commands, found = {}, {}
    for name, table in tables.items():
        if name not in SECTIONS:
            commands[name] = table
            continue
        if name == "admission":  # (its sub-tables, checked by their own rules, before any command runs)
            found[name] = dict(AdmissionConfig.from_table(table) and table)
            continue
        if not isinstance(table, dict):
            raise ConfigError(f"{name} must be a table ([{name}]) of {SECTIONS[name].__name__} fields, got {table!r}")
        fields = [f.name for f in dataclasses.fields(SECTIONS[name])]
        for key in table:
            if key not in fields:
                raise _unknown(f"[{name}] field", key, fields, _fields_elsewhere(but=name))
        found[name] = dict(table)
    return commands, found


def option_defaults(command: click.Command, found: dict[str, dict]) -> tuple[dict, dict[str, dict]]:
    """The sections' fields that `command` has an option for, as its default_map entries, and the
    rest, which the command applies to its configs itself (`advanced`)."""
    options = {p.name for p in command.params if p.expose_value}  # not a retired one
    defaults, rest = {}, {}
    for section, table in found.items():
        for field, value in table.items():
            option = OPTION_OF.get((section, field), field)
            if option in options and ((section, field) in OPTION_OF or _owner(option) == section):
                defaults[option] = list(value) if isinstance(value, tuple) else value
            else:
                rest.setdefault(section, {})[field] = value
    return defaults, rest


def _owner(option: str) -> str | None:
    """The section whose field `option` sets when it is named as the field (the first that has it, in
    the order `join` builds them)."""
    for section in ("island", "network", "diloco", "train", "model", "discovery"):
        if option in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            return section
    return None


def command_defaults(group: click.Group, tables: dict, where: str = "") -> dict:
    """The file's command tables as click's default_map, checked against the commands."""
    out = {}
    for name, table in tables.items():
        cmd, section = group.commands.get(name), f"{where}{name}"
        if cmd is None:
            raise _unknown("table", f"[{section}]", [f"[{where}{c}]" for c in group.commands] + [f"[{s}]" for s in SECTIONS])
        if not isinstance(table, dict):
            raise ConfigError(f"{section} must be a table ([{section}]) of option defaults, got {table!r}")
        if isinstance(cmd, click.Group):
            out[name] = command_defaults(cmd, table, f"{section}.")
            continue
        # an option is named as on the command line (`local-steps`, `json`) or as its parameter
        names = {p.name: p.name for p in cmd.params if p.name}
        names |= {o[2:].replace("-", "_"): p.name for p in cmd.params for o in p.opts if o.startswith("--")}
        for k in table:
            if k.replace("-", "_") not in names:
                known = sorted(o[2:] for p in cmd.params for o in p.opts if o.startswith("--"))
                raise _unknown(f"[{section}] option", k, known, _fields_elsewhere() if name in SECTION_COMMANDS else None)
        out[name] = {names[k.replace("-", "_")]: v for k, v in table.items()}
    return out


def default_map(root: click.Group, tables: dict) -> tuple[dict, dict[str, dict]]:
    """click's default_map for `root`, and the section fields `join` applies itself (see the module
    docstring)."""
    commands, found = sections(tables)
    out = command_defaults(root, commands)
    advanced: dict[str, dict] = {}
    for path in SECTION_COMMANDS if found else ():
        *groups, name = path.split(".")
        group, slot = root, out
        for g in groups:
            group, slot = group.commands[g], slot.setdefault(g, {})
        defaults, advanced = option_defaults(group.commands[name], found)
        slot[name] = {**defaults, **slot.get(name, {})}  # the command's own table wins over the sections
    return out, advanced


def _advanced() -> dict[str, dict]:
    """The config file's section fields that no option sets (`ctx.meta`, set by `--config`)."""
    ctx = click.get_current_context(silent=True)
    return {} if ctx is None else ctx.meta.get(ADVANCED, {})


def advanced_field(section: str, field: str) -> object | None:
    """The config file's `[section] field` when no option sets it (None when the file does not)."""
    return _advanced().get(section, {}).get(field)


def advanced_section(section: str) -> dict:
    """The config file's `[section]` table as far as no option sets it (`[admission]`: all of it)."""
    return dict(_advanced().get(section, {}))


def apply_advanced(configs: dict[str, object]) -> dict[str, object]:
    """`configs` (by section name) with the config file's fields that have no option applied
    (validated again by each config's own checks)."""
    advanced = _advanced()
    return {name: dataclasses.replace(c, **advanced[name]) if advanced.get(name) else c for name, c in configs.items()}
