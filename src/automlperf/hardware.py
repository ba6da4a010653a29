"""What this node has to compute with: its accelerators as torch sees them, and the CPU cores
this process may use. torch is imported only by the functions that ask it."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from automlperf.errors import UserError


class DeviceError(UserError):
    """More devices were asked for than are visible."""


# The device files through which Linux runtimes reach their accelerators: NVIDIA's (WSL's
# /dev/dxg), ROCm's, Intel's render nodes and Ascend's.
ACCELERATOR_NODES = ("nvidia[0-9]*", "nvidiactl", "dxg", "kfd", "dri/renderD*", "davinci[0-9]*")


def accelerator_nodes_present(dev: Path = Path("/dev"), platform: str | None = None) -> bool:
    """Whether this machine may have an accelerator torch can use: on Linux, only where one
    of their device files exists; elsewhere, always (torch is asked). A process that needs
    nothing else from torch (the primary) does not import it (1.5 CPU-s) to learn there is
    none."""
    import sys

    if not (platform or sys.platform).startswith("linux"):
        return True
    return any(any(dev.glob(pattern)) for pattern in ACCELERATOR_NODES)


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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_uuid(torch: Any, device: Any) -> str | None:
    """The UUID of a CUDA (or ROCm) device, by which the node's sampler finds it."""
    if device.type != "cuda":
        return None
    raw = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return gpu_uuid(raw, bool(getattr(torch.version, "hip", None))) or None


def visible_accelerators() -> list[str]:
    """Every accelerator torch can use here, as device strings (``cuda:0`` on NVIDIA and
    ROCm, ``xpu:0`` on Intel, ``npu:0`` with Ascend's plugin)."""
    if not accelerator_nodes_present():
        return []
    import torch

    kind = accelerator_type(torch)
    if kind is None:
        return []
    return [f"{kind}:{i}" for i in range(device_count(torch, kind))]


def choose_devices(count: int | None, require: bool = False) -> list[str]:
    """The first ``count`` visible accelerators (default all); without any, ``count`` CPU
    ranks (default 1), which share the host's cores, unless accelerators are ``require``d:
    then :class:`DeviceError` says why none is seen."""
    gpus = visible_accelerators()
    if not gpus and require:
        import torch

        raise DeviceError(missing_accelerators(torch, os.environ))
    if gpus:
        if count is not None and count > len(gpus):
            raise DeviceError(f"{count} devices requested but only {len(gpus)} accelerators "
                              "are visible")
        return gpus[: count or len(gpus)]
    return ["cpu"] * (count or 1)


HIDING = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
          "ZE_AFFINITY_MASK", "ASCEND_RT_VISIBLE_DEVICES")


def missing_accelerators(torch: Any, env: Mapping[str, str],
                         device_files: list[str] | None = None) -> str:
    """Why ``torch`` sees no accelerator on this node, in one line naming the fix: a build of
    torch without GPU support, a visibility variable that hides every device, or a process
    that was given none (a job step's cgroup without the device files, no driver)."""
    import glob
    import warnings

    version = str(torch.__version__)
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    other = any(getattr(getattr(torch, kind, None), "is_available", lambda: False)()
                for kind in ("xpu", "npu", "mps"))
    if not cuda and not hip and not other:
        return (f"accelerators were asked for, but this torch ({version}) is a CPU-only build: "
                "install a CUDA (or ROCm) build of torch on the nodes (PyTorch's install "
                "selector gives the pip command for the nodes' driver), or, to train on "
                "CPUs, ask for none (--gpus-per-node 0, run.require_accelerators = false)")
    for name in HIDING:
        if name in env and env[name].strip() in ("", "-1", "NoDevFiles"):
            return (f"accelerators were asked for, but {name}={env[name]!r} hides every device "
                    f"from this process: unset it, or ask the scheduler for GPUs "
                    "(--gpus-per-node)")
    said = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.is_available()
    if caught:
        said = f" (torch says: {str(caught[0].message).strip().splitlines()[0]})"
    files = glob.glob("/dev/nvidia[0-9]*") if device_files is None else device_files
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "its accelerator plugin"
    where = ("no /dev/nvidia<N> device file is visible here: the job step was given no GPU "
             "(ask for --gpus-per-node) or its cgroup hides them"
             if cuda and not files else "the driver or the devices are not usable here: check "
             "the node with nvidia-smi (rocm-smi)")
    return f"accelerators were asked for, but torch {version} ({build}) sees none{said}; {where}"


def accelerator_memory_gib() -> float | None:
    """Memory of the smallest visible accelerator, GiB; None without any."""
    devices = visible_accelerators()
    if not devices:
        return None
    import torch

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
