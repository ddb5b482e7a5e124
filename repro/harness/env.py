"""The environment each rank needs, for every DeepSpeed version we support."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from pathlib import Path

from repro.harness.report import Record

CACHE_VAR = "ZERO3_SP_CACHE"


def cache_root() -> Path:
    if os.environ.get(CACHE_VAR):
        return Path(os.environ[CACHE_VAR])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zero3-sp-gradfix"


def torch_extensions_dir() -> Path:
    """One folder per DeepSpeed install (location, version, torch, python): the CPU comm op is built once each."""
    spec = importlib.util.find_spec("deepspeed")
    location = str(Path(spec.origin).parent) if spec and spec.origin else "none"
    deepspeed = dist_version("deepspeed") or "none"
    key = "|".join([location, deepspeed, dist_version("torch") or "none", sys.version])
    return cache_root() / "torch_extensions" / f"ds{deepspeed}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def rank_environment(backend: str, world_size: int, local_world_size: int) -> dict[str, str]:
    return {
        "DS_ACCELERATOR": "cuda" if backend == "nccl" else "cpu",
        # The CPU accelerator's device_count(): without it 0.14/0.15 shell out to numactl
        # inside __avg_scatter_grads, and the multi-node branch is picked wrongly.
        "LOCAL_SIZE": str(local_world_size),
        "TORCH_EXTENSIONS_DIR": str(torch_extensions_dir()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # one thread a rank: ranks do not starve
    }


class HostEnvironment(Record):
    """What a result ran on, as reports record it: versions and counts, never this machine's paths."""

    os: str
    python: str
    torch: str | None
    transformers: str | None = None  # absent in results written before it was recorded
    backend: str
    device: str
    gpus: int
    cpus: int | None
    machine: str


def host_environment(backend: str) -> HostEnvironment:
    from repro.harness.cli import gpu_count

    return HostEnvironment(os=platform.platform(), python=platform.python_version(), torch=dist_version("torch"),
                           transformers=dist_version("transformers"), backend=backend,
                           device="cuda" if backend == "nccl" else "cpu", gpus=gpu_count(), cpus=os.cpu_count(),
                           machine=platform.machine())
