"""Device and precision in one place: which accelerator, which autocast, how state leaves it.

Like accelerate's `Accelerator`, this is the only module that decides where tensors live: the rest
of the code asks `resolve_device` once and moves things with `.to(device)`, never `.cuda()`. A
device that is not there is a user error (`DeviceError`, one line saying what to use instead),
raised before any swarm, server or process starts.

bf16 runs the forward and backward pass under autocast while the weights and the optimizer state
stay fp32, so the outer state and the exchanged payloads do not change with the precision.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from typing import ContextManager

import torch

from p2p_diloco.config import DEVICE_RE, DEVICES_HELP
from p2p_diloco.errors import DeviceError

_SPEC = re.compile(DEVICE_RE)


def _local_rank() -> int | None:
    """The rank's GPU under torchrun (which sets LOCAL_RANK), else None."""
    rank = os.environ.get("LOCAL_RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def _cuda(spec: str, index: int | None) -> torch.device:
    """cuda:index, checked against what is here; no index means this rank's GPU (or cuda:0)."""
    if not torch.cuda.is_available():
        why = ("no GPU is visible" if torch.version.cuda else
               f"torch {torch.__version__} is a CPU build: `make install CUDA=1` installs a CUDA one")
        raise DeviceError(f"--device {spec}: CUDA is not available here ({why}; `p2p-diloco doctor` says what this "
                          f"machine has); use --device cpu or auto")
    index = index if index is not None else (_local_rank() or 0)
    count = torch.cuda.device_count()
    if index >= count:
        have = ", ".join(f"cuda:{i}" for i in range(count))
        raise DeviceError(f"--device {spec}: only {count} CUDA device{'s' * (count != 1)} here ({have})")
    return torch.device("cuda", index)


def resolve_device(spec: str) -> torch.device:
    """The torch device for `auto|cpu|cuda|cuda:N|mps`; `auto` prefers CUDA, then MPS, then the CPU.

    Under torchrun (LOCAL_RANK set) `auto` and `cuda` mean cuda:LOCAL_RANK, so each rank of an island
    trains on its own GPU.
    """
    m = _SPEC.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise DeviceError(f"--device {spec!r}: not a device; use one of {DEVICES_HELP}")
    if spec == "auto":
        if torch.cuda.is_available():
            return _cuda("auto", None)
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if not _mps_available():
            raise DeviceError("--device mps: MPS (Apple GPU) is not available here; use --device cpu or auto")
        return torch.device("mps")
    return _cuda(spec, int(m.group(2)[1:]) if m.group(2) else None)


def autocast(device: torch.device, precision: str) -> ContextManager:
    """The context the forward pass runs in: nothing for fp32, bf16 autocast for bf16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise DeviceError(f"--precision {precision}: use fp32 or bf16")
    is_available = getattr(torch.amp.autocast_mode, "is_autocast_available", None)
    if is_available is not None and not is_available(device.type):
        raise DeviceError(f"--precision bf16: autocast is not available on {device}; use --precision fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns and disables autocast where bf16 is unsupported
        try:
            ctx = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        except RuntimeError as e:
            raise DeviceError(f"--precision bf16 on {device}: {e}; use --precision fp32") from e
    if not getattr(ctx, "_enabled", True):
        raise DeviceError(f"--precision bf16: {device.type} autocast does not support bf16 here; use --precision fp32")
    return ctx


def pinned_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """A float32 host buffer for copies off `device`: pinned for CUDA (fast, asynchronous), plain otherwise."""
    return torch.empty(numel, dtype=torch.float32, pin_memory=device.type == "cuda")


def to_host(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """Copy `x` (any device, buf.numel() values) into the host buffer `buf` and return `buf`, ready to read."""
    cuda = x.device.type == "cuda"
    buf.view(x.shape).copy_(x.detach(), non_blocking=cuda and buf.is_pinned())
    if cuda:
        torch.cuda.current_stream(x.device).synchronize()  # the copy was asynchronous; wait for it, not the device
    return buf


def copy_async(x: torch.Tensor, buf: torch.Tensor) -> torch.cuda.Event | None:
    """Start copying `x` into the host buffer `buf` without waiting for it: off CUDA the copy is done
    when this returns (None); from CUDA into a pinned `buf` it is queued on the current stream, and the
    event returned is what a reader on another thread waits on (`Event.synchronize`) before reading `buf`."""
    cuda = x.device.type == "cuda"
    buf.view(x.shape).copy_(x.detach(), non_blocking=cuda and buf.is_pinned())
    if not cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(x.device))
    return event


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on `device` is done (for timing it; a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> int | None:
    """Start a new window for `peak_memory_bytes` on `device`; the bytes allocated there now (None where torch
    keeps no count: the CPU and MPS, whose peak is the process's resident set, `bench.memory.PeakMeter`)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """The most bytes this process's tensors held on `device` since it started or `reset_peak_memory`
    (CUDA's allocator count, `torch.cuda.max_memory_allocated`); None where torch keeps no count."""
    if device.type != "cuda":
        return None
    synchronize(device)
    return torch.cuda.max_memory_allocated(device)
