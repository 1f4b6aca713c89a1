"""The `p2p-diloco` command line: one click group, one module per command group.

This is the composition root: each command parses options, builds a config and calls the library.
Heavy imports (torch, hivemind, zmq, textual) happen inside command bodies so that
`p2p-diloco --help` is instant. Expected failures become `click.ClickException` (no traceback).

Commands: `simulate` (simulate.py), `bootstrap` (bootstrap.py), `join` (join.py), `status` and
`dashboard` (watch.py), `demo` (demo.py), `bench transport|swarm` (bench.py); shared options in
options.py. This module holds the root group: logging and `--config FILE`.
"""

from __future__ import annotations

import logging
import sys

import click

from p2p_diloco import __version__
from p2p_diloco.cli import bench, bootstrap, demo, join, simulate, watch
from p2p_diloco.errors import ConfigError


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def load_toml(path: str) -> dict[str, dict]:
    """Read a TOML config file into `{section: {field: value}}` (the CLI checks the names)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    return data


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    """`--config FILE`: a TOML file whose `[command]` tables give defaults for that command's options.

    Precedence stays flag > environment variable (P2P_DILOCO_<COMMAND>_<OPTION>) > file > default.
    """
    if path is None:
        return
    try:
        ctx.default_map = _default_map(ctx.command, load_toml(path))
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


def _default_map(group: click.Group, tables: dict, where: str = "") -> dict:
    """The file's tables as click's default_map, checked against the commands: a misspelt table or
    option is an error naming what exists, not a setting silently ignored."""
    out = {}
    for name, table in tables.items():
        cmd, section = group.commands.get(name), f"{where}{name}"
        if cmd is None:
            raise ConfigError(f"[{section}]: no such command; known: {', '.join(sorted(group.commands))}")
        if not isinstance(table, dict):
            raise ConfigError(f"{section} must be a table ([{section}]) of option defaults, got {table!r}")
        if isinstance(cmd, click.Group):
            out[name] = _default_map(cmd, table, f"{section}.")
            continue
        # an option is named as on the command line (`local-steps`, `json`) or as its parameter
        names = {p.name: p.name for p in cmd.params if p.name}
        names |= {o[2:].replace("-", "_"): p.name for p in cmd.params for o in p.opts if o.startswith("--")}
        unknown = sorted(k for k in table if k.replace("-", "_") not in names)
        if unknown:
            known = sorted(o[2:] for p in cmd.params for o in p.opts if o.startswith("--"))
            raise ConfigError(f"[{section}]: unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}")
        out[name] = {names[k.replace("-", "_")]: v for k, v in table.items()}
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "P2P_DILOCO"})
@click.version_option(__version__, prog_name="p2p-diloco")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--config", type=click.Path(dir_okay=False), callback=_load_config_file, expose_value=False,
              is_eager=True, help="TOML file with a [command] table of option defaults per command.")
def main(verbose: int) -> None:
    """Peer-to-peer DiLoCo: train one model across machines on ordinary internet links."""
    _setup_logging(verbose)


for _command in (simulate.simulate, bootstrap.bootstrap, watch.status, watch.dashboard, join.join, demo.demo,
                 bench.bench):
    main.add_command(_command)
