"""What this node has to compute with: its accelerators as torch sees them, and the CPU cores
this process may use. torch is imported only by the functions that ask it."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from automlperf.errors import UserError


class DeviceError(UserError):
    """More devices were asked for than are visible."""


def accelerator_type(torch: Any) -> str | None:
    """The kind of accelerator torch will use here (``cuda`` also on ROCm, ``xpu``, ``npu``
    through its plugin, ...), or None for the CPU. CUDA is asked first, as before;
    ``torch.accelerator`` (torch 2.6 and newer) knows every other backend."""
    if torch.cuda.is_available():
        return "cuda"
    api = getattr(torch, "accelerator", None)
    if api is None or not api.is_available():
        return None
    device = api.current_accelerator()
    return None if device is None else str(device.type)


def device_count(torch: Any, kind: str) -> int:
    if kind == "cuda":
        return int(torch.cuda.device_count())
    return int(torch.accelerator.device_count())


def gpu_uuid(raw: str, rocm: bool = False) -> str:
    """A CUDA device's UUID as NVML spells it (``GPU-...``; torch gives it bare). ROCm's stay
    as amdsmi spells them."""
    if not raw or rocm or raw.startswith("GPU-"):
        return raw
    return f"GPU-{raw}"


def device_name(torch: Any, device: Any) -> str:
    """The product name of a torch device (``cpu`` for the CPU)."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    module: Any = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(module, "get_device_name"):
        return str(module.get_device_name(device.index))
    return str(device.type)


def device_uuid(torch: Any, device: Any) -> str | None:
    """The UUID of a CUDA (or ROCm) device, by which the node's sampler finds it."""
    if device.type != "cuda":
        return None
    raw = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return gpu_uuid(raw, bool(getattr(torch.version, "hip", None))) or None


def visible_accelerators() -> list[str]:
    """Every accelerator torch can use here, as device strings (``cuda:0`` on NVIDIA and
    ROCm, ``xpu:0`` on Intel, ``npu:0`` with Ascend's plugin)."""
    import torch

    kind = accelerator_type(torch)
    if kind is None:
        return []
    return [f"{kind}:{i}" for i in range(device_count(torch, kind))]


def choose_devices(count: int | None) -> list[str]:
    """The first ``count`` visible accelerators (default all); without any, ``count`` CPU
    ranks (default 1), which share the host's cores."""
    gpus = visible_accelerators()
    if gpus:
        if count is not None and count > len(gpus):
            raise DeviceError(f"{count} devices requested but only {len(gpus)} accelerators "
                              "are visible")
        return gpus[: count or len(gpus)]
    return ["cpu"] * (count or 1)


def accelerator_memory_gib() -> float | None:
    """Memory of the smallest visible accelerator, GiB; None without any."""
    import torch

    devices = visible_accelerators()
    if not devices:
        return None
    if devices[0].startswith("cuda"):
        return min(torch.cuda.get_device_properties(i).total_memory
                   for i in range(len(devices))) / 2**30
    return min(torch.accelerator.get_memory_info(i)[1] for i in range(len(devices))) / 2**30


def cores_available() -> int:
    """CPU cores this process may use: its affinity mask, capped by its cgroup's CPU quota.
    SLURM's variables describe the job, not necessarily this step (since Slurm 22.05 a step
    does not inherit --cpus-per-task), so the kernel's view is the one to trust."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def cgroup_cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup"),
                     self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup (v2) may use, or None without a limit."""
    try:
        line = next(ln for ln in self_cgroup.read_text().splitlines() if ln.startswith("0::"))
        quota, period = (cgroup_root / line[3:].lstrip("/") / "cpu.max").read_text().split()[:2]
    except (OSError, StopIteration, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
