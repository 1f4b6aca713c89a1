"""`--config FILE`: TOML defaults per command, below environment variables and flags, and checked."""

import pytest
from click.testing import CliRunner

from p2p_diloco.cli import main


def write(tmp_path, toml: str) -> str:
    path = tmp_path / "p2p.toml"
    path.write_text(toml)
    return str(path)


def resolved(config: str, path: list[str], args: list[str] = ()) -> dict:
    """The parameters command `path` would run with, parsed and resolved by click (not run)."""
    parent = main.make_context("p2p-diloco", ["--config", config, *path, *args])
    group = main
    for i, name in enumerate(path):
        group = group.get_command(parent, name)
        parent = group.make_context(name, [*path[i + 1:], *args], parent=parent)
    return parent.params


@pytest.mark.parametrize("toml, message", [
    ("[jion]\nlocal-steps = 3\n", "[jion]: no such command"),
    ("simulate = 1\n", "simulate must be a table"),
    ("[simulate]\nlocal-stepz = 3\n", "[simulate]: unknown option(s) local-stepz"),
    ("[bench.swarm]\nislandz = 3\n", "[bench.swarm]: unknown option(s) islandz"),
    ("[simulate\n", "is not valid TOML"),
])
def test_bad_config_file_is_a_readable_error(tmp_path, toml, message):
    r = CliRunner().invoke(main, ["--config", write(tmp_path, toml), "simulate", "--help"])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_file_sets_defaults_below_environment_and_flags(tmp_path, monkeypatch):
    config = write(tmp_path, "[simulate]\nlocal-steps = 7\nouter_lr = 0.3\nislands = 3\njson = true\n"
                             "[bench.swarm]\nislands = 2\n")
    monkeypatch.setenv("P2P_DILOCO_SIMULATE_OUTER_LR", "0.9")
    p = resolved(config, ["simulate"], ["--islands", "5"])
    assert p["local_steps"] == 7 and p["as_json"] is True  # from the file, by flag name or parameter name
    assert p["outer_lr"] == 0.9  # the environment beats the file
    assert p["islands"] == 5  # a flag beats both
    assert resolved(config, ["bench", "swarm"])["islands"] == 2  # nested tables for subcommands
