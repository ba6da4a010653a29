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

from automlperf import hardware
from automlperf.hardware import accelerator_type, cpu_model, device_count, gpu_uuid

# Dense peak operations per second of one device as torch numbers them, by device name
# fragment (first match wins), bf16 or, where the device has no bf16, fp16. Sources:
# NVIDIA H200 product brief (2024), H100 data sheet (2023, SXM and PCIe), A100 data sheet
# (2021), L40S data sheet (2023), L4 data sheet (2023), A10 data sheet (2021), V100 data
# sheet (2020, fp16 tensor), T4 data sheet (2019, fp16).
# AMD Instinct MI300X data sheet (2023): 1307.4 TFLOPS dense bf16. AMD Instinct MI250X data
# sheet (2021): 383 TFLOPS bf16 for the package of two GCDs, and MI250: 362.1; ROCm shows
# each GCD as its own device, so a device is half of that.
# Intel Data Center GPU Max 1550 product brief (2023): 128 Xe cores with 8 XMX engines of
# 512 bf16 operations per clock at 1.6 GHz, 838.9 TFLOPS for the card's two stacks; with
# the driver's default flat hierarchy (ZE_FLAT_DEVICE_HIERARCHY=FLAT, as on Aurora) each
# stack is one device, so a device is half of that.
# Huawei Ascend 910B: the Atlas 800T A2 training server data sheet (2023) gives 8 NPUs ~2.5
# PFLOPS fp16, 313 TFLOPS each (910B3); Ascend 910 (2019 launch, AIPerf's 2020 #1): 256
# TFLOPS fp16. torch_npu names them e.g. "Ascend910B3".
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
    ("MI300X", 1307.4e12, "bf16"),
    ("MI250X", 191.5e12, "bf16"),
    ("MI250", 181.05e12, "bf16"),
    ("Max 1550", 419.4e12, "bf16"),
    ("Ascend910B", 313.0e12, "fp16"),
    ("Ascend910", 256.0e12, "fp16"),
]


def peak_for(name: str) -> tuple[float, str] | None:
    for fragment, peak, precision in PEAKS:
        if fragment.lower() in name.lower():
            return peak, precision
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


VENDORS = {"cuda": "NVIDIA", "xpu": "Intel", "npu": "Huawei", "mps": "Apple"}


def accelerators() -> list[dict[str, Any]]:
    """Visible accelerators as torch numbers them, with NVML (NVIDIA) or amdsmi (AMD)
    details matched by UUID where those libraries are present."""
    if not hardware.accelerator_nodes_present():
        return []
    try:
        import torch
    except ImportError:
        return []
    kind = accelerator_type(torch)
    if kind is None:
        return []
    if kind == "cuda":
        return _cuda_devices(torch)
    module: Any = getattr(torch, kind, None)
    out = []
    for i in range(device_count(torch, kind)):
        props = module.get_device_properties(i) if hasattr(module, "get_device_properties") \
            else None
        name = str(getattr(props, "name", "") or "") or (
            module.get_device_name(i) if hasattr(module, "get_device_name") else kind)
        memory = getattr(props, "total_memory", None)
        if memory is None and hasattr(torch, "accelerator"):
            memory = torch.accelerator.get_memory_info(i)[1]
        peak = peak_for(name)
        out.append({"index": i, "name": name, "type": kind,
                    "vendor": VENDORS.get(kind, kind),
                    "memory_gib": round(memory / 2**30, 2) if memory else None,
                    "peak_ops": peak[0] if peak else None,
                    "peak_precision": peak[1] if peak else None})
    return out


def _cuda_devices(torch: Any) -> list[dict[str, Any]]:
    rocm = bool(getattr(torch.version, "hip", None))
    details = _amdsmi_by_uuid() if rocm else _nvml_by_uuid()
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = gpu_uuid(str(getattr(props, "uuid", "") or ""), rocm)
        peak = peak_for(props.name)
        entry = {"index": i, "name": props.name, "type": "cuda",
                 "vendor": "AMD" if rocm else "NVIDIA",
                 "memory_gib": round(props.total_memory / 2**30, 2),
                 "uuid": uuid, "capability": f"{props.major}.{props.minor}",
                 "peak_ops": peak[0] if peak else None,
                 "peak_precision": peak[1] if peak else None}
        entry.update(details.get(uuid, {}))
        out.append(entry)
    return out


def _amdsmi_by_uuid() -> dict[str, dict[str, Any]]:
    """Driver version and power cap of AMD GPUs through amdsmi (the ``amd`` extra)."""
    try:
        import amdsmi
    except ImportError:
        return {}
    try:
        amdsmi.amdsmi_init()
    except Exception:  # noqa: BLE001 - no driver: no details
        return {}
    try:
        out = {}
        for handle in amdsmi.amdsmi_get_processor_handles():
            try:
                uuid = str(amdsmi.amdsmi_get_gpu_device_uuid(handle))
                driver = amdsmi.amdsmi_get_gpu_driver_info(handle).get("driver_version")
                cap = amdsmi.amdsmi_get_power_cap_info(handle).get("power_cap")
            except Exception:  # noqa: BLE001 - a device without these reports nothing
                continue
            out[uuid] = {"driver": driver,
                         "power_limit_w": cap / 1e6 if isinstance(cap, (int, float)) else None}
        return out
    finally:
        amdsmi.amdsmi_shut_down()


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
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError:
            driver = None
        out: dict[str, dict[str, Any]] = {}
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError:
            return out  # NVML that cannot even count its devices describes none
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError:
                continue  # a device this process may not query (another job's, on a shared node)
            try:
                power = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
            except pynvml.NVMLError:
                power = None
            out[uuid] = {"driver": driver, "power_limit_w": power}
        return out
    finally:
        pynvml.nvmlShutdown()


def torch_build() -> dict[str, Any]:
    """torch's version and the CUDA and ROCm it was built for, as ``torch.version`` gives
    them, read from that module's file without loading torch (1.5 CPU-s); where no
    accelerator can be used, that is all a description needs of it."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            found[target.id] = value.value
    if "__version__" not in found:
        return {}
    return {"torch": found["__version__"], "cuda": found.get("cuda"), "hip": found.get("hip"),
            "cudnn": None}


def describe(nodes: int = 1, simulated: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The system description stored as system.json with every run. A simulated run gives
    its simulated devices: the node's real accelerators are not the ones it reports on, and
    torch is not asked."""
    import psutil

    torch_info: dict[str, Any] = {}
    if simulated is None and not hardware.accelerator_nodes_present():
        torch_info = torch_build()
    elif simulated is None:
        try:
            import torch

            torch_info = {"torch": torch.__version__, "cuda": torch.version.cuda,
                          "hip": getattr(torch.version, "hip", None),
                          "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available()
                          else None}
        except ImportError:
            pass
    accel = accelerators() if simulated is None else simulated
    return {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": {"model": cpu_model(), "logical_cores": psutil.cpu_count(logical=True),
                "physical_cores": psutil.cpu_count(logical=False),
                "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else psutil.cpu_count()},
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "accelerators": accel,
        "accelerator_count": len(accel),
        "peak_ops_per_node": sum(a["peak_ops"] or 0 for a in accel) or None,
        "simulated": simulated is not None,
        "nodes": nodes,
        "software": {"python": platform.python_version(), **torch_info,
                     **{p: _version(p) for p in ("automlperf", "numpy", "optuna", "sqlalchemy",
                                                 "scipy", "nvidia-ml-py", "amdsmi")}},
        "slurm": {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST",
                                             "SLURM_JOB_NUM_NODES", "SLURM_CLUSTER_NAME")
                  if k in os.environ},
    }
