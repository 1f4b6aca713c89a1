"""The `p2p-diloco` command line: one click group, one module per command group.

This is the composition root: each command parses options, builds a config and calls the library.
Heavy imports (torch, hivemind, zmq, textual) happen inside command bodies so that
`p2p-diloco --help` is instant. Expected failures become `click.ClickException` (no traceback).

Commands: `simulate` (simulate.py), `bootstrap` (bootstrap.py), `join` (join.py), `status` and
`dashboard` (watch.py), `demo` (demo.py), `doctor` (doctor.py), `prepare` and `bench prepare` (prepare.py),
`export` and `generate` (export.py), `bench transport|swarm|round|attack|gpu` (bench.py), `bench discovery` (scale.py),
`bench reference` and `bench keep` (reference.py); shared options in options.py. This module holds the root group: logging and
`--config FILE` (read by `config_file.py`).
"""

from __future__ import annotations

import logging
import sys

import click

from p2p_diloco import __version__
from p2p_diloco.cli import bench, bootstrap, demo, doctor, export, join, prepare, reference, scale, simulate, watch
from p2p_diloco.cli.config_file import ADVANCED, default_map, load_toml
from p2p_diloco.errors import ConfigError


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    """`--config FILE`: config sections and command tables of option defaults (`cli.config_file`)."""
    if path is None:
        return
    try:
        ctx.default_map, ctx.meta[ADVANCED] = default_map(ctx.command, load_toml(path))
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "P2P_DILOCO"})
@click.version_option(__version__, prog_name="p2p-diloco")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--config", type=click.Path(dir_okay=False), callback=_load_config_file, expose_value=False,
              is_eager=True, help="TOML file of settings: [diloco], [network], ... tables of config fields for join, and "
                   "[command] tables of option defaults.")
def main(verbose: int) -> None:
    """Peer-to-peer DiLoCo: train one model across machines on ordinary internet links."""
    _setup_logging(verbose)


for _command in (simulate.simulate, bootstrap.bootstrap, watch.status, watch.dashboard, join.join, demo.demo,
                 doctor.doctor, prepare.prepare, export.export, export.generate, bench.bench):
    main.add_command(_command)
bench.bench.add_command(prepare.bench_prepare)
bench.bench.add_command(scale.bench_discovery)
bench.bench.add_command(scale.bench_churn)
bench.bench.add_command(reference.bench_reference)
bench.bench.add_command(reference.bench_keep)
