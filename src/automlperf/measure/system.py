"""What machine a result was measured on: CPU, memory, accelerators, software versions.

Accelerator peaks are dense (no sparsity) tensor-core throughput in the precision a run
uses by default, from the vendors' data sheets, so a report can show achieved / peak.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from typing import Any

# Dense peak operations per second by device name fragment (first match wins), bf16 or, where
# the device has no bf16, fp16. Sources: NVIDIA H200 product brief (2024), H100 data sheet
# (2023, SXM and PCIe), A100 data sheet (2021), L40S data sheet (2023), L4 data sheet (2023),
# A10 data sheet (2021), V100 data sheet (2020, fp16 tensor), T4 data sheet (2019, fp16).
PEAKS: list[tuple[str, float, str]] = [
    ("H200", 989.4e12, "bf16"),
    ("H100 PCIe", 756.0e12, "bf16"),
    ("H100 NVL", 835.0e12, "bf16"),
    ("H100", 989.4e12, "bf16"),
    ("A100", 312.0e12, "bf16"),
    ("L40S", 362.05e12, "bf16"),
    ("L4", 121.0e12, "bf16"),
    ("A10", 125.0e12, "bf16"),
    ("V100", 125.0e12, "fp16"),
    ("T4", 65.0e12, "fp16"),
]


def peak_for(name: str) -> tuple[float, str] | None:
    for fragment, peak, precision in PEAKS:
        if fragment.lower() in name.lower():
            return peak, precision
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def accelerators() -> list[dict[str, Any]]:
    """Visible GPUs as torch numbers them, with NVML details matched by UUID."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    nvml = _nvml_by_uuid()
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "") or "")
        if uuid and not uuid.startswith("GPU-"):
            uuid = f"GPU-{uuid}"
        peak = peak_for(props.name)
        entry = {"index": i, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                 "uuid": uuid, "capability": f"{props.major}.{props.minor}",
                 "peak_ops": peak[0] if peak else None,
                 "peak_precision": peak[1] if peak else None}
        entry.update(nvml.get(uuid, {}))
        out.append(entry)
    return out


def _nvml_by_uuid() -> dict[str, dict[str, Any]]:
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            try:
                power = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
            except pynvml.NVMLError:
                power = None
            out[uuid] = {"driver": driver, "power_limit_w": power}
        return out
    finally:
        pynvml.nvmlShutdown()


def describe(nodes: int = 1) -> dict[str, Any]:
    """The system description stored as system.json with every run."""
    import psutil

    try:
        import torch

        torch_info = {"torch": torch.__version__, "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None}
    except ImportError:
        torch_info = {}
    accel = accelerators()
    return {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": {"model": _cpu_model(), "logical_cores": psutil.cpu_count(logical=True),
                "physical_cores": psutil.cpu_count(logical=False),
                "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else psutil.cpu_count()},
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "accelerators": accel,
        "accelerator_count": len(accel),
        "peak_ops_per_node": sum(a["peak_ops"] or 0 for a in accel) or None,
        "nodes": nodes,
        "software": {"python": platform.python_version(), **torch_info,
                     **{p: _version(p) for p in ("automlperf", "numpy", "optuna", "sqlalchemy",
                                                 "scipy", "nvidia-ml-py")}},
        "slurm": {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST",
                                             "SLURM_JOB_NUM_NODES", "SLURM_CLUSTER_NAME")
                  if k in os.environ},
    }
