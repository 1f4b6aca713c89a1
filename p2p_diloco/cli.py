"""The `p2p-diloco` command line: one click group, one small function per subcommand.

This is the only composition root: each command parses options, builds a config and calls the
library. Heavy imports (torch, hivemind, zmq, textual) happen inside command bodies so that
`p2p-diloco --help` is instant. Expected failures become `click.ClickException` (no traceback).
"""

from __future__ import annotations

import logging
import sys

import click

from p2p_diloco import __version__


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "P2P_DILOCO"})
@click.version_option(__version__, prog_name="p2p-diloco")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Peer-to-peer DiLoCo: train one model across machines on ordinary internet links."""
    _setup_logging(verbose)
