"""`p2p-diloco doctor`: what this machine offers an island, and whether `join` can start here.

It asks torch, not the documentation: torch's version and build (CPU, or the CUDA or ROCm version
it was built for), the devices it sees (names, memory), bf16 support on each (the project's own
`autocast` check for the CPU, `torch.cuda.is_bf16_supported` for a GPU), NCCL and gloo (the
back-ends of a torchrun island), and the ports an island would listen on, chosen as `join` chooses
them (`island_ports`: `--port P` gives P, P+1, P+2; 0 any free ones) on `--host`, each tried with a
bind. `--host` and `--port` default to what `join` would take (its flag's environment variable,
then its config-file table, then the config default), so `p2p-diloco --config FILE doctor` checks
the file's settings. It ends with one verdict line; `--json` prints one object instead. Exit code
1 when `join` could not start with these settings (a port taken, a host not here), else 0.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from typing import Any

import click

from p2p_diloco.cli.config_file import advanced_field
from p2p_diloco.cli.join import island_ports
from p2p_diloco.config import DiscoveryConfig, IslandConfig

GIB = 2**30


def _join_default(ctx: click.Context, name: str, fallback: Any) -> Any:
    """What `join` takes for its option `name` when not given as a flag: its environment variable, its
    config-file table (with the file's config sections already folded in), else the config default."""
    env = os.environ.get(f"P2P_DILOCO_JOIN_{name.upper()}")
    if env is not None:
        return env
    return ((ctx.find_root().default_map or {}).get("join") or {}).get(name, fallback)


def torch_facts() -> dict[str, Any]:
    """torch's version and build, the devices it sees, bf16, NCCL and gloo."""
    import torch
    import torch.distributed as dist

    from p2p_diloco.core.device import autocast
    from p2p_diloco.errors import DeviceError

    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU"
    try:
        autocast(torch.device("cpu"), "bf16")
        cpu_bf16 = True
    except DeviceError:
        cpu_bf16 = False
    devices = [{"device": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "bf16": cpu_bf16}]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for i in range(gpus):
        p = torch.cuda.get_device_properties(i)
        devices.append({"device": f"cuda:{i}", "name": p.name, "memory_bytes": p.total_memory,
                        "capability": f"{p.major}.{p.minor}", "bf16": torch.cuda.is_bf16_supported()})
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append({"device": "mps", "name": "Apple GPU (MPS)"})
    nccl = dist.is_available() and dist.is_nccl_available()
    nccl_version = ".".join(map(str, torch.cuda.nccl.version())) if nccl and gpus else None
    return {"torch": {"version": torch.__version__, "build": build, "cuda": cuda, "hip": hip,
                      "cudnn": torch.backends.cudnn.version() if cuda else None},
            "cuda_available": bool(gpus), "devices": devices,
            "nccl": {"available": nccl, "version": nccl_version},
            "gloo": dist.is_available() and dist.is_gloo_available()}


def port_facts(host: str, port: int, dht_port: int | None) -> dict[str, Any]:
    """The island's ports on `host` as `join` picks them, each tried with a TCP bind (0: any free
    port, so only the host is tried)."""
    exchange, dht, px = island_ports(port, dht_port)
    ports = {"state_exchange": exchange, "dht": dht, "peer_exchange": px}
    problems = {}
    for name, p in ports.items():
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                s.bind((host, p))
        except OSError as e:
            problems[name] = f"{host}:{p or 'any'}: {e.strerror or e}"
    return {"host": host, **ports, "problems": problems}


def verdict(facts: dict[str, Any]) -> tuple[bool, str]:
    """(join can start with these settings, one line saying what an island gets here)."""
    t, ports = facts["torch"], facts["ports"]
    if ports["problems"]:
        return False, "NOT READY: " + "; ".join(f"{k.replace('_', ' ')} port {v}" for k, v in ports["problems"].items())
    gpus = [d for d in facts["devices"] if d["device"].startswith("cuda")]
    if gpus:
        g = gpus[0]
        precision = "bf16" if g["bf16"] else "fp32 (no bf16 on this GPU)"
        multi = (f"; torchrun --nproc-per-node {len(gpus)} makes one island of all of them"
                 + ("" if facts["nccl"]["available"] else ", but NCCL is missing (gloo only)")) if len(gpus) > 1 else ""
        return True, (f"READY for GPU training: torch {t['version']} ({t['build']}), {len(gpus)} GPU(s), {g['name']} "
                      f"{g['memory_bytes'] / GIB:.0f} GiB: join --device cuda --precision {precision}{multi}")
    if t["cuda"]:
        return True, (f"READY on the CPU only: torch {t['version']} is a CUDA {t['cuda']} build but sees no GPU "
                      "(driver, CUDA_VISIBLE_DEVICES?): join --device cpu")
    if any(d["device"] == "mps" for d in facts["devices"]):
        return True, f"READY on the Apple GPU: torch {t['version']}: join --device mps"
    return True, (f"READY on the CPU only: torch {t['version']} is a {t['build']} build: join --device cpu (on a "
                  "machine with an NVIDIA GPU, `make install CUDA=1` installs a CUDA build, README \"Set-up\")")


@click.command()
@click.option("--host", default=None, help=f"Address the island would listen on (default: join's, {DiscoveryConfig.host}).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help=f"join's --port (default: join's, {IslandConfig.port}: any free ports).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def doctor(ctx: click.Context, host: str | None, port: int | None, as_json: bool) -> None:
    """What this machine offers an island: torch build, devices, bf16, NCCL, gloo, ports; one verdict."""
    host = host if host is not None else _join_default(ctx, "host", DiscoveryConfig.host)
    if port is None:
        given = _join_default(ctx, "port", IslandConfig.port)
        try:
            port = int(given)
        except ValueError:
            raise click.BadParameter(f"join's port {given!r} is not a number", param_hint="--port") from None
    dht_port = advanced_field("discovery", "port")
    facts = {**torch_facts(), "ports": port_facts(host, port, int(dht_port) if dht_port is not None else None)}
    ready, line = verdict(facts)
    facts |= {"ready": ready, "verdict": line}
    if as_json:
        click.echo(json.dumps(facts))
    else:
        _print(facts)
    ctx.exit(0 if ready else 1)


def _print(f: dict[str, Any]) -> None:
    t, p = f["torch"], f["ports"]
    click.echo(f"torch      {t['version']} ({t['build']}{', cuDNN ' + str(t['cudnn']) if t['cudnn'] else ''})")
    for d in f["devices"]:
        memory = f", {d['memory_bytes'] / GIB:.1f} GiB" if "memory_bytes" in d else ""
        extra = f", {d['cores']} cores" if "cores" in d else f", compute {d['capability']}" if "capability" in d else ""
        bf16 = "" if "bf16" not in d else ", bf16" if d["bf16"] else ", no bf16"
        click.echo(f"device     {d['device']}: {d['name']}{extra}{memory}{bf16}")
    nccl = f"yes ({f['nccl']['version']})" if f["nccl"]["version"] else "yes" if f["nccl"]["available"] else "no"
    click.echo(f"NCCL       {nccl}")
    click.echo(f"gloo       {'yes' if f['gloo'] else 'no'}")
    ports = ", ".join(f"{k.replace('_', ' ')} {v or 'any'}" for k, v in p.items() if k not in ("host", "problems"))
    click.echo(f"ports      on {p['host']}: {ports}")
    click.echo(f["verdict"])
