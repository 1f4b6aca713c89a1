"""The swarm secret on the command line: `--secret`, `--secret-file`, their variables, and where it goes."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.cli.options import resolve_secret, secret_options

SECRET = "correct horse battery staple"


@click.command()
@secret_options("test")
def show(secret, secret_file):
    click.echo(f"secret={resolve_secret(secret, secret_file)!r}")


def run(args: list[str], env: dict | None = None):
    env = {"P2P_DILOCO_SECRET": None, "P2P_DILOCO_SECRET_FILE": None, **(env or {})}
    return CliRunner().invoke(show, args, env=env)


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "swarm.secret"
    path.write_text(f"  {SECRET}\n\n")
    path.chmod(0o600)
    return path


def test_the_secret_comes_from_a_file_stripped_or_from_the_environment(secret_file):
    for args, env in (([f"--secret-file={secret_file}"], None), ([], {"P2P_DILOCO_SECRET_FILE": str(secret_file)}),
                      ([], {"P2P_DILOCO_SECRET": SECRET}), (["--secret", SECRET], None)):
        r = run(args, env)
        assert r.exit_code == 0, r.output
        assert r.output == f"secret={SECRET!r}\n"  # no warning: the file is the owner's only
    assert run([]).output == "secret=None\n"


def test_a_flag_beats_the_other_variable_and_both_at_one_level_is_an_error(secret_file):
    r = run([f"--secret-file={secret_file}"], {"P2P_DILOCO_SECRET": "from the environment"})
    assert r.output == f"secret={SECRET!r}\n"
    assert run(["--secret", "flag"], {"P2P_DILOCO_SECRET_FILE": str(secret_file)}).output == "secret='flag'\n"
    for args, env in ((["--secret", "x", f"--secret-file={secret_file}"], None),
                      ([], {"P2P_DILOCO_SECRET": "x", "P2P_DILOCO_SECRET_FILE": str(secret_file)})):
        r = run(args, env)
        assert r.exit_code == 2 and "both given; pass one" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("content, message", [(None, "does not exist"), ("  \n", "is empty"), (b"\xff\xfe", "cannot read")])
def test_a_missing_empty_or_unreadable_file_is_one_clear_line(tmp_path, content, message):
    path = tmp_path / "swarm.secret"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    r = run([f"--secret-file={path}"])
    assert r.exit_code == 2 and message in r.output and "--secret-file" in r.output
    assert "Traceback" not in r.output and r.output.count("Error") == 1


def test_a_file_others_can_read_is_used_with_a_warning(secret_file):
    secret_file.chmod(0o644)
    r = run([f"--secret-file={secret_file}"])
    assert r.exit_code == 0
    warnings = [line for line in r.output.splitlines() if line.startswith("Warning")]
    assert len(warnings) == 1 and "chmod 600" in warnings[0] and "644" in warnings[0]


@pytest.mark.parametrize("command", [["join"], ["status"], ["dashboard"]])
def test_every_command_with_a_secret_takes_a_secret_file(command):
    r = CliRunner().invoke(main, [*command, "--help"])
    assert r.exit_code == 0 and "--secret TEXT" in r.output and "--secret-file FILE" in r.output


def test_join_gives_one_secret_to_the_exchange_and_to_discovery(secret_file, monkeypatch):
    seen = {}

    def fake_run_island(island, model, train, diloco, network, discovery, data, vocab_size=None, parts=None):
        seen.update(discovery=discovery)
        return 0, {}

    monkeypatch.setattr("p2p_diloco.peers.launch.process.run_island", fake_run_island)
    r = CliRunner().invoke(main, ["join", "--secret-file", str(secret_file), "--device", "cpu"],
                           env={"P2P_DILOCO_SECRET": None, "P2P_DILOCO_SECRET_FILE": None})
    assert r.exit_code == 0, r.output
    assert seen["discovery"].secret == SECRET
    assert SECRET not in repr(seen["discovery"])


def test_the_api_keeps_the_secret_in_its_one_home(monkeypatch):
    torch = pytest.importorskip("torch")
    from p2p_diloco.config import DiscoveryConfig
    from p2p_diloco.peers import api

    captured = {}
    monkeypatch.setattr(api, "SwarmIsland", lambda *a, **kw: captured.update(kw))  # no swarm: only the configs
    model = torch.nn.Linear(2, 2)
    for kwargs, expected in (({"secret": SECRET}, SECRET), ({"discovery": DiscoveryConfig(secret="d")}, "d"),
                             ({}, None)):
        api.join(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
        assert captured["discovery"].secret == expected, kwargs
