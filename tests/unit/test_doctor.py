"""`p2p-diloco doctor`: its JSON against torch's own answers, the ports `join` would take, the verdict."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner

from p2p_diloco.cli import main

pytestmark = pytest.mark.timeout(60)


def doctor(*args: str, env: dict | None = None):
    result = CliRunner().invoke(main, ["doctor", "--json", *args], env=env)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output.strip().splitlines()[-1])


def test_json_says_what_torch_says():
    code, out = doctor()
    t = out["torch"]
    assert t["version"] == torch.__version__ and t["cuda"] == torch.version.cuda
    assert t["build"] == (f"CUDA {torch.version.cuda}" if torch.version.cuda else
                          f"ROCm {torch.version.hip}" if torch.version.hip else "CPU")
    assert out["cuda_available"] == torch.cuda.is_available()
    names = [d["device"] for d in out["devices"]]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert names[0] == "cpu" and names[1:1 + gpus] == [f"cuda:{i}" for i in range(gpus)]
    cpu = out["devices"][0]
    assert cpu["cores"] == os.cpu_count() and cpu["memory_bytes"] > 2**28
    for i in range(gpus):
        d = out["devices"][1 + i]
        assert d["name"] == torch.cuda.get_device_name(i)
        assert d["memory_bytes"] == torch.cuda.get_device_properties(i).total_memory
        assert d["bf16"] == torch.cuda.is_bf16_supported()
    assert out["nccl"]["available"] == (dist.is_available() and dist.is_nccl_available())
    assert out["gloo"] == (dist.is_available() and dist.is_gloo_available())
    # nothing of the default settings blocks an island: any free ports on 127.0.0.1
    assert code == 0 and out["ready"] is True and out["ports"]["problems"] == {}
    assert out["ports"] | {"problems": None} == {"host": "127.0.0.1", "state_exchange": 0, "dht": 0,
                                                 "peer_exchange": 0, "problems": None}
    assert out["verdict"].startswith("READY")
    if not torch.cuda.is_available():
        assert "CPU only" in out["verdict"] and "join --device cpu" in out["verdict"]


def test_ports_are_joins_and_a_taken_one_is_a_clear_verdict():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        if taken > 65535 - 2:
            pytest.skip("the OS gave a port too high for PORT+2")
        code, out = doctor("--port", str(taken))
    p = out["ports"]
    assert (p["state_exchange"], p["dht"], p["peer_exchange"]) == (taken, taken + 1, taken + 2)  # as `join --port`
    assert code == 1 and out["ready"] is False
    assert list(p["problems"]) == ["state_exchange"] + [k for k in ("dht", "peer_exchange") if k in p["problems"]]
    assert out["verdict"].startswith("NOT READY: state exchange port 127.0.0.1:" + str(taken))


def test_host_and_port_come_from_joins_settings(tmp_path):
    # join's environment variable, then its config-file sections: what `join` would take
    code, out = doctor(env={"P2P_DILOCO_JOIN_HOST": "0.0.0.0"})
    assert out["ports"]["host"] == "0.0.0.0" and code == 0
    cfg = tmp_path / "c.toml"
    cfg.write_text('[discovery]\nhost = "127.0.0.1"\nport = 40111\n[island]\nport = 40100\n')
    result = CliRunner().invoke(main, ["--config", str(cfg), "doctor", "--json"])
    assert result.exit_code in (0, 1), result.output
    p = json.loads(result.output)["ports"]
    assert (p["host"], p["state_exchange"], p["dht"], p["peer_exchange"]) == ("127.0.0.1", 40100, 40111, 40102)


def test_plain_output_ends_with_the_verdict():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"torch      {torch.__version__}") and lines[-1].startswith("READY")
    assert any(line.startswith("device     cpu:") for line in lines)
