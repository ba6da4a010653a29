"""The node's own items: its devices and their driver, each device's measured dense ceiling,
and its energy counters."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from automlperf.runner.doctor.common import Check, Node, Shape


def devices(node: Node, shape: Shape) -> Check:
    from automlperf.measure.system import describe
    from automlperf.train.data import shm_free

    system = describe()
    sw = system["software"]
    build = f"torch {sw.get('torch')}" + (f" (CUDA {sw['cuda']})" if sw.get("cuda") else "") + \
        (f" (ROCm {sw['hip']})" if sw.get("hip") else "")
    shm = shm_free()
    figures = {"devices": node.devices, "threads_per_rank": node.threads, "cores": node.cores,
               "system": system, "shm_free_bytes": shm}
    if node.accelerated:
        names = sorted({a["name"] for a in system["accelerators"]})
        drivers = sorted({str(a.get("driver")) for a in system["accelerators"] if a.get("driver")})
        what = (f"{len(node.devices)} x {', '.join(names)}"
                + (f", driver {', '.join(drivers)}" if drivers else "") + f", {build}, "
                f"{node.threads} cores per device")
    else:
        what = (f"CPU only: {system['cpu']['model'] or 'unknown CPU'}, {node.cores} usable "
                f"cores, {build}")
    # A GPU the driver sees but torch cannot use is the commonest set-up mistake.
    if not node.accelerated and shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if listed.returncode == 0 and "GPU" in listed.stdout:
            return Check("devices", "fail", what + "; nvidia-smi lists GPUs torch cannot use",
                         "install a CUDA build of PyTorch (TORCH_SPEC='torch' make setup) "
                         "and check CUDA_VISIBLE_DEVICES", figures)
    if node.accelerated and node.threads < 2:
        return Check("devices", "warn", what, f"only {node.threads} CPU core per device: "
                     "decoding will starve the devices; give the job more cores", figures)
    return Check("devices", "pass", what, figures=figures)


def ceiling(node: Node, shape: Shape) -> Check:
    from automlperf.measure.ceiling import run_measurement

    measured = run_measurement(node.devices, node.req.precision, node.threads,
                               seconds=1.0 if node.req.quick else 3.0)
    if "error" in measured:
        return Check("ceiling", "fail", measured["error"], "run `python -m "
                     "automlperf.measure.ceiling --devices cpu` to see the error", measured)
    node.ceiling_ops = measured["ceiling_ops"]
    parts = [f"{r['device']} {r['ops_per_s'] / 1e12:.3g} TOPS ({r['precision']} "
             f"{r.get('kernel', 'matmul')})" for r in measured["ceiling"]]
    measured.pop("system", None)
    return Check("ceiling", "pass", f"dense: {', '.join(parts)}; node "
                 f"{node.ceiling_ops / 1e12:.3g} TOPS", figures=measured)


def energy(node: Node, shape: Shape) -> Check:
    from automlperf.measure.energy import RaplReader

    figures: dict[str, Any] = {}
    missing: list[str] = []
    if node.accelerated:
        from automlperf.hardware import device_uuid
        from automlperf.measure.monitor import open_gpu_sampler

        import torch

        uuids = [u for u in (device_uuid(torch, torch.device(d)) for d in node.devices) if u]
        samples = open_gpu_sampler(uuids).sample()
        figures["devices"] = samples
        with_energy = [s for s in samples if s.get("energy_mj") is not None]
        if len(with_energy) < len(node.devices):
            missing.append(f"{len(node.devices) - len(with_energy)} of {len(node.devices)} "
                           "devices report no energy counter")
    rapl = RaplReader()
    figures["cpu_domains"] = sorted(rapl.domains)
    if not rapl.domains:
        missing.append(f"CPU: {rapl.error}")
    summary = ("every device reports energy" if not missing else "; ".join(missing)) + (
        f"; CPU packages: {len(rapl.domains)}" if rapl.domains else "")
    if missing:
        advice = ("OPS per watt will not be reported: " + (
            "install nvidia-ml-py (or amdsmi) and check the driver's energy counter"
            if node.accelerated and len(missing) > 1 or (node.accelerated and rapl.domains)
            else "make /sys/class/powercap/intel-rapl:*/energy_uj readable to the job"))
        return Check("energy", "warn", summary, advice, figures)
    return Check("energy", "pass", summary, figures=figures)
