"""`--device` and `--precision`: resolution, one-line errors, bf16 autocast, the inner step under it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from p2p_diloco.cli import main
from p2p_diloco.config import DiLoCoConfig, ModelConfig, TrainConfig
from p2p_diloco.core.device import autocast, pinned_buffer, resolve_device, to_host
from p2p_diloco.core.inner import InnerLoop, evaluate
from p2p_diloco.core.model import build_model
from p2p_diloco.errors import ConfigError, DeviceError

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@needs_cpu_only
def test_auto_and_cpu_resolve_to_the_cpu_here(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    expected = "mps" if torch.backends.mps.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


@needs_cpu_only
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_is_one_clear_line(spec):
    with pytest.raises(DeviceError) as e:
        resolve_device(spec)
    msg = one_line(str(e.value))
    assert msg.startswith(f"--device {spec}: CUDA is not available here") and "--device cpu or auto" in msg


def test_mps_is_an_error_unless_available():
    if torch.backends.mps.is_available():
        assert resolve_device("mps").type == "mps"
        return
    with pytest.raises(DeviceError, match="MPS"):
        resolve_device("mps")


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "CUDA", "cuda:", "cpu\n", ""])
def test_malformed_spec_lists_the_accepted_forms(spec):
    with pytest.raises(DeviceError, match=r"auto\|cpu\|cuda\|cuda:N\|mps"):
        resolve_device(spec)


@pytest.fixture
def two_gpus(monkeypatch):
    """Pretend CUDA with two devices: what resolution picks does not touch a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_cuda_index_beyond_the_devices_names_those_there(two_gpus):
    assert resolve_device("cuda") == torch.device("cuda", 0) and resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceError) as e:
        resolve_device("cuda:3")
    assert one_line(str(e.value)) == "--device cuda:3: only 2 CUDA devices here (cuda:0, cuda:1)"


def test_torchrun_puts_each_rank_on_its_own_gpu(two_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # an explicit index wins


def test_bf16_autocast_on_cpu_computes_in_bf16_and_keeps_fp32_weights():
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with autocast(torch.device("cpu"), "bf16"):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(x).dtype == torch.float32


def test_unknown_precision_is_a_device_error():
    with pytest.raises(DeviceError, match="fp32 or bf16"):
        autocast(torch.device("cpu"), "fp8")


def test_host_copy_goes_through_a_plain_buffer_off_cuda():
    buf = pinned_buffer(6, torch.device("cpu"))
    assert buf.dtype == torch.float32 and buf.device.type == "cpu" and not buf.is_pinned()
    x = torch.arange(6, dtype=torch.bfloat16).view(2, 3)
    assert to_host(x, buf) is buf and buf.tolist() == [0, 1, 2, 3, 4, 5]


def batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(0, 256, (2, 33), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def test_inner_step_in_bf16_trains_the_tiny_gpt_on_cpu():
    torch.manual_seed(0)
    model = build_model(ModelConfig())
    before = [p.detach().clone() for p in model.parameters()]
    inner = InnerLoop(model, TrainConfig(precision="bf16", warmup_steps=0))
    (x, y), = batches(1, seed=1)
    loss = inner.train_step(x, y)
    assert torch.isfinite(torch.tensor(loss)) and 4.0 < loss < 7.0  # about ln 256 = 5.5 at initialisation
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    state = inner.optimizer.state[next(model.parameters())]
    assert state["exp_avg"].dtype == torch.float32
    fp32, bf16 = evaluate(model, batches(2, seed=2)), evaluate(model, batches(2, seed=2), precision="bf16")
    assert abs(fp32 - bf16) < 0.1  # the same model, evaluated at either precision


def test_config_checks_the_syntax_of_device_and_precision():
    assert TrainConfig().device == "auto" and TrainConfig().precision == "fp32"
    assert not DiLoCoConfig().offload_outer
    with pytest.raises(ConfigError, match="train.device"):
        TrainConfig(device="gpu")
    with pytest.raises(ConfigError, match="train.precision"):
        TrainConfig(precision="fp16")
    with pytest.raises(ConfigError, match="diloco.offload_outer"):
        DiLoCoConfig(offload_outer="yes")
    assert TrainConfig(device="cuda:3").device == "cuda:3"  # whether it exists is checked when resolved


@needs_cpu_only
@pytest.mark.parametrize("command", ["simulate", "demo", "join"])
def test_cli_without_cuda_prints_one_line_and_exits_2(command):
    r = CliRunner().invoke(main, [command, "--device", "cuda"])
    assert r.exit_code == 2, r.output
    line = one_line(r.output)
    assert line.startswith("Error: --device cuda:") and "CUDA" in line and "Traceback" not in r.output


@needs_cpu_only
def test_join_with_cuda_exits_2_in_a_real_process_and_leaves_nothing_behind(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "p2p_diloco", "join", "--device", "cuda", "--run-dir", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    assert p.returncode == 2, out + err
    assert "CUDA" in one_line(out + err) and "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # no helper (DHT daemon, server) outlived the command
    assert not any(tmp_path.iterdir())  # it failed before writing anything


def test_malformed_device_on_the_command_line_is_a_usage_error():
    r = CliRunner().invoke(main, ["simulate", "--device", "gpu"])
    assert r.exit_code == 2 and "Invalid value for '--device'" in r.output and "cuda:N" in r.output
