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
    ("[jion]\nlocal-steps = 3\n", "table '[jion]' is unknown; did you mean '[join]'?"),
    ("simulate = 1\n", "simulate must be a table"),
    ("[simulate]\nlocal-stepz = 3\n", "[simulate] option 'local-stepz' is unknown; did you mean 'local-steps'?"),
    ("[bench.swarm]\nislandz = 3\n", "[bench.swarm] option 'islandz' is unknown; did you mean 'islands'?"),
    ("[diloco]\nlocal_step = 3\n", "[diloco] field 'local_step' is unknown; did you mean 'local_steps'?"),
    ("[island]\njoin_timeout = 3\n", "[island] field 'join_timeout' is unknown; did you mean [discovery] join_timeout?"),
    ("[join]\nlr_warmup = 3\n", "[join] option 'lr_warmup' is unknown; did you mean [train] warmup_steps?"),
    ("[join]\ntotal_step = 3\n", "[join] option 'total_step' is unknown; did you mean [train] total_steps?"),
    ("[join]\nzzz = 3\n", "[join] option 'zzz' is unknown; none of the"),
    ("[foo]\nx = 3\n", "table '[foo]' is unknown; known: [admission], [bench], [bootstrap]"),
    ("diloco = 1\n", "diloco must be a table ([diloco]) of DiLoCoConfig fields"),
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
    from p2p_diloco.peers.launch.demo import DemoConfig

    from p2p_diloco.sim.config import SimConfig

    known = {"DemoConfig": DemoConfig, "SimConfig": SimConfig}
    return [known[n] if n in known else getattr(config, n) for n in names]


SECTIONS = {
    # command: (config sections, first match wins; options named differently from their field)
    "join": (("IslandConfig", "NetworkConfig", "DiLoCoConfig", "TrainConfig", "ModelConfig", "DiscoveryConfig"),
             {"model_size": "size"}),
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
        if not param.expose_value:  # a removed option, which only says what replaced it
            continue
        field = renamed.get(param.name, param.name)
        owner = next((c for c in sections if field in {f.name for f in dataclasses.fields(c)}), None)
        if owner is None:
            continue
        default = getattr(owner, field)
        shown = param.get_default(ctx)
        if param.name in ("methods", "bandwidth_mbps") and isinstance(shown, str):  # a comma list on the command line
            default = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        if isinstance(default, Path):
            default = str(default)
        assert shown == default or (shown is None and default == ()), \
            f"{path} --{param.name.replace('_', '-')} defaults to {shown!r}; {owner.__name__}.{field} is {default!r}"
        checked.append(param.name)
    assert checked, f"{path}: no option matched a config field"


def test_config_sections_set_every_field_of_join_below_its_flags(tmp_path, monkeypatch):
    """`[diloco]`, `[island]`, ... tables: fields with a flag become its default (the flag and the
    command's own table still win), fields without one are applied to the configs `join` builds."""
    seen = {}

    def fake_run_island(island, model, train, diloco, network, discovery, data, vocab_size=None, **faults):
        seen.update(island=island, diloco=diloco, network=network, discovery=discovery, model=model)
        return 0, {}

    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island", fake_run_island)
    config = write(tmp_path, "[diloco]\nlocal_steps = 7\ntoken_weighting = false\nmix_weight = 0.4\n"
                             "[island]\nsame_version_wait = 0.2\nport = 7100\n[model]\nsize = 'small'\n"
                             "[network]\nmax_window_bytes = 33554432\n[discovery]\nrun_id = 'from-file'\n"
                             "[join]\nrun-id = 'from-table'\n")
    r = CliRunner().invoke(main, ["--config", config, "join", "--device", "cpu", "-H", "9"])
    assert r.exit_code == 0, r.output
    d, i = seen["diloco"], seen["island"]
    assert d.local_steps == 9 and not d.token_weighting and d.mix_weight == 0.4  # the flag beats the section
    assert i.same_version_wait == 0.2 and i.port == 7100 and seen["discovery"].port == 7101  # --port's DHT port
    assert seen["model"].size == "small" and seen["network"].max_window_bytes == 2**25
    assert seen["discovery"].run_id == "from-table"  # the command's own table beats the section
    bad = write(tmp_path, "[diloco]\nmax_token_ratio = 0.5\n")
    r = CliRunner().invoke(main, ["--config", bad, "join", "--device", "cpu"])
    assert r.exit_code == 2 and "diloco.max_token_ratio" in r.output and "Traceback" not in r.output


def test_settings_without_a_join_flag_come_from_the_config_file(tmp_path, monkeypatch):
    """The model's shape, the seed, threads, the outer step, intervals, codec, timeout and DHT port:
    set in the file, they reach the configs `join` builds (and torch's thread count)."""
    import torch

    seen = {}
    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island",
                        lambda *configs, **kw: (seen.update(zip(("island", "model", "train", "diloco", "network",
                                                                 "discovery"), configs)), (0, {}))[1])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.update(threads=n))
    config = write(tmp_path, "[model]\nn_layer = 2\nblock_size = 32\n[train]\nseed = 5\nthreads = 3\n"
                             "[diloco]\nouter_lr = 0.5\nfinal_mix = false\nround_seconds = 4.0\n"
                             "[island]\neval_every = 7\ncheckpoint_every = 9\n"
                             "[network]\ncompression = 'fp16'\nfetch_timeout_s = 30.0\n[discovery]\nport = 7500\n")
    r = CliRunner().invoke(main, ["--config", config, "join", "--device", "cpu", "--port", "7000", "--max-rounds", "4"])
    assert r.exit_code == 0, r.output
    assert seen["model"].resolved()["n_layer"] == 2 and seen["train"].seed == 5 and seen["threads"] == 3
    assert seen["train"].total_steps == 4 * seen["diloco"].local_steps  # the schedule spans --max-rounds
    d, i, n = seen["diloco"], seen["island"], seen["network"]
    assert (d.outer_lr, d.final_mix, d.round_seconds) == (0.5, False, 4.0)
    assert (i.eval_every, i.checkpoint_every, n.compression, n.fetch_timeout_s) == (7, 9, "fp16", 30.0)
    assert (i.port, seen["discovery"].port, seen["discovery"].px_port) == (7000, 7500, 7002)
    clash = write(tmp_path, "[discovery]\nport = 7002\n")
    r = CliRunner().invoke(main, ["--config", clash, "join", "--device", "cpu", "--port", "7000"])
    assert r.exit_code == 2 and "[discovery] port" in r.output and "Traceback" not in r.output, r.output


def _config_file_only():
    from p2p_diloco.cli.join import CONFIG_FILE_ONLY

    return CONFIG_FILE_ONLY


@pytest.mark.parametrize("flag, section, field", _config_file_only())
def test_a_flag_join_does_not_take_names_its_config_table(flag, section, field):
    given = flag.split("/")[-1]  # --no-final-mix as well as --final-mix
    r = CliRunner().invoke(main, ["join", given] + ([] if "/" in flag else ["3"]))
    field = field or flag[2:].replace("-", "_")
    assert r.exit_code == 2 and f"set {field} in its [{section}] table" in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["bootstrap", "--identity", "id.key", "--port", "70000"], "port must be in [0, 65534], got 70000"),
    (["bootstrap", "--identity", "no-such-dir/id.key"], "the directory of the identity file"),
    (["bootstrap", "--identity", "id.key", "--relay", "--discovery", "dht"], "--relay needs the rendezvous"),
    (["bootstrap", "--identity", "id.key", "--relay", "--relay-upload-mbps", "-1"], "network.max_upload_mbps must be"),
    (["join", "--join-timeout", "0"], "set join_timeout in its [discovery] table"),
    (["join", "--data", "no-such-file.txt"], "data path no-such-file.txt does not exist"),
    (["status", "--bootstrap", "tcp://127.0.0.1:9", "--timeout", "0"], "discovery.connect_timeout must be in (0, 600]"),
    (["bench", "swarm", "--bandwidth-mbps", "1000,0.5"], "one rate > 0, or 4 of them (--islands)"),
])
def test_usage_and_config_errors_exit_2_in_every_command(tmp_path, monkeypatch, args, message):
    """One exit code for a bad setting, whoever checks it (click, a config's own checks, the bootstrap
    node): 2; 1 is left to failures at run time (README, "Exit codes")."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_the_demo_table_shows_every_island_by_its_whole_name_in_80_columns():
    import io

    from rich.console import Console

    from p2p_diloco.cli.demo import islands_table

    rows = [{"id": f"island-{i}", "initial_loss": 5.353, "eval_loss": 2.792, "tokens": 12_275_776, "version": 1234,
             "mixes": 1000, "refused": 3, "failed_fetches": 12, "utilization": 0.884} for i in (0, 15)]
    out = io.StringIO()
    Console(width=80, file=out).print(islands_table(rows, "16 islands, 3 minutes each"))
    body = out.getvalue().splitlines()[-2:]
    assert [line.split() for line in body] == [[f"island-{i}", "5.353", "2.792", "12,275,776", "1234", "1000", "3",
                                                "12", "0.884"] for i in (0, 15)]
    assert "refused" in out.getvalue() and "…" not in out.getvalue()


def test_a_demo_of_one_uplink_per_island_starts_each_on_its_own_link():
    """`bench swarm --bandwidth-mbps 1000,1000,0.5,0.5`: each island's `bench member` emulates its own uplink."""
    from p2p_diloco.errors import ConfigError
    from p2p_diloco.peers.launch.demo import DemoConfig

    cfg = DemoConfig(islands=4, latency_ms=100, bandwidth_mbps=(1000.0, 1000.0, 0.5, 0.5))
    assert [c[c.index("--bandwidth-mbps") + 1] for c in map(cfg.island_command, range(4))] == ["1000.0", "1000.0", "0.5", "0.5"]
    assert DemoConfig(islands=2).island_command(1) == ("join",)
    with pytest.raises(ConfigError, match="one rate > 0 or 3 of them"):
        DemoConfig(islands=3, bandwidth_mbps=(1.0, 2.0))
