"""`--config FILE`: TOML defaults per command, below environment variables and flags, and checked."""

from pathlib import Path

import click
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



def _sections(*names: str) -> list:
    from p2p_diloco import config
    from p2p_diloco.peers.demo import DemoConfig

    from p2p_diloco.sim.config import SimConfig

    known = {"DemoConfig": DemoConfig, "SimConfig": SimConfig}
    return [known[n] if n in known else getattr(config, n) for n in names]


SECTIONS = {
    # command: (config sections, first match wins; options named differently from their field)
    "join": (("IslandConfig", "NetworkConfig", "DiLoCoConfig", "TrainConfig", "ModelConfig", "DiscoveryConfig"),
             {"model_size": "size", "host": "bind_host", "fetch_timeout": "fetch_timeout_s"}),
    "simulate": (("SimConfig", "DiLoCoConfig", "TrainConfig", "ModelConfig"), {"model_size": "size"}),
    "demo": (("DemoConfig", "TrainConfig", "DiLoCoConfig"), {}),
    "status": (("DiscoveryConfig",), {"timeout": "connect_timeout"}),
    "dashboard": (("DiscoveryConfig",), {"refresh": "poll"}),
    "bootstrap": (("DiscoveryConfig",), {}),
    "bench swarm": (("SimConfig", "DiLoCoConfig"), {}),
}


@pytest.mark.parametrize("path", sorted(SECTIONS))
def test_every_option_that_sets_a_config_field_defaults_to_that_field(path):
    """A default is written once, in the config dataclasses: an option that sets a field has its default."""
    import dataclasses

    command = main
    for name in path.split():
        command = command.commands[name]
    names, renamed = SECTIONS[path]
    sections = _sections(*names)
    checked, ctx = [], click.Context(command)
    for param in command.params:
        field = renamed.get(param.name, param.name)
        owner = next((c for c in sections if field in {f.name for f in dataclasses.fields(c)}), None)
        if owner is None:
            continue
        default = getattr(owner, field)
        if isinstance(default, tuple) and param.name == "methods":
            default = ",".join(default)  # a comma list on the command line
        if isinstance(default, Path):
            default = str(default)
        shown = param.get_default(ctx)
        assert shown == default or (shown is None and default == ()), \
            f"{path} --{param.name.replace('_', '-')} defaults to {shown!r}; {owner.__name__}.{field} is {default!r}"
        checked.append(param.name)
    assert checked, f"{path}: no option matched a config field"
