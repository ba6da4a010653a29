"""`automlperf doctor`: one command that tells a site whether a node is ready to run the
benchmark and how close it comes to its hardware. It runs the node checklist on whatever the
node has (CUDA, ROCm, XPU or CPU only): the devices and their driver, each device's dense
ceiling in the run's precision, the seed ResNet-50 at 224 training alone (eager, channels
last, compiled), memory at the default batch and at the top of TPE's range, the input
pipeline's decoding capacity against what the devices consume, energy counters, and a short
`automlperf run` of the official shape on a generated ImageNet-layout folder followed by
`automlperf check`. Each item passes, warns or fails with one line saying what to change.

``quick`` shrinks every item (a small seed at 32 px, no compilation, a run of one round) so
that the test suite can take the same path; its figures are not the official shape's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The fraction of the measured ceiling below which training alone warns. A CPU's ceiling
# is the faster of its matrix product and its 3x3 convolution, the kernels training runs; a
# GPU's ResNet-50 reaches a much smaller share of its tensor cores' dense rate (MLPerf's
# tuned ResNet-50 on an H100 is about a fifth of its bf16 matmul rate).
TRAIN_FRACTION_WARN = {"cpu": 0.5, "accelerator": 0.15}
# torch.compile's gain over eager training above which the doctor names it.
COMPILE_GAIN = 0.05
# Decoding capacity over what the devices consume: below 1 they starve; below this they
# would starve on a node a little busier than now.
DECODE_HEADROOM = 1.5
STATUSES = ("pass", "warn", "fail", "skip")
# The generated folder holds about this long an epoch at the node's measured training rate,
# so that the short run completes epochs on any node; at least MIN_PER_CLASS training images
# a class give the decoding measurement a few hundred files, at most MAX_PER_CLASS keep its
# generation under a minute on a GPU node.
EPOCH_TARGET_S = 30.0
CLASSES, MIN_PER_CLASS, MAX_PER_CLASS = 10, 16, 500
# The short run: time for the replica to start (process, ceiling, first candidate), then
# at least this many epochs; longer than MAX_RUN_S is refused (a site's whole dataset).
RUN_START_S, RUN_EPOCHS, MAX_RUN_S = 30.0, 2, 1800.0


@dataclass
class Check:
    """One item of the checklist."""

    name: str
    status: str  # one of STATUSES
    summary: str  # the measured figures, in words
    advice: str = ""  # what to change on a warning or a failure; on a pass, what would gain
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class DoctorRequest:
    out: Path
    quick: bool = False
    devices: int | None = None
    precision: str = "auto"
    run_duration_s: float = 150.0
    data_dir: Path | None = None  # an ImageNet-layout folder of the site's; else generated


@dataclass
class Shape:
    """The model and the images the checklist trains on."""

    model: str
    image_size: int
    classes: int
    official: bool


@dataclass
class DoctorReport:
    checks: list[Check]
    path: Path  # doctor.json
    shape: Shape

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {"shape": asdict(self.shape), "checks": [asdict(c) for c in self.checks],
                "passed": not self.failed, "generated_at": time.time()}


class _Node:
    """What the earlier items found, for the later ones."""

    def __init__(self, req: DoctorRequest) -> None:
        from automlperf.hardware import choose_devices, cores_available
        from automlperf.train.trainer import channels_last_default

        self.req = req
        self.devices = choose_devices(req.devices)
        self.cores = cores_available()
        self.threads = max(1, self.cores // len(self.devices))
        self.accelerated = self.devices[0] != "cpu"
        self.channels_last = channels_last_default(self.devices[0].split(":")[0])
        self.ceiling_ops: float | None = None
        # All devices, uncompiled, in the layout a run trains in (any uncompiled rate if
        # that item failed), for sizing the pipeline's need and the official run.
        self.train_images_per_s: float | None = None
        self.rates: dict[str, float] = {}  # images/s of each training item


def run_doctor(req: DoctorRequest, on_check: Callable[[Check], None] | None = None) -> DoctorReport:
    """Run the checklist, writing ``req.out/doctor.json`` after every item (an interrupted
    doctor keeps what it measured)."""
    req.out.mkdir(parents=True, exist_ok=True)
    shape = (Shape("resnet_small", 32, 4, False) if req.quick
             else Shape("resnet50", 224, 1000, True))
    report = DoctorReport([], req.out / "doctor.json", shape)
    node = _Node(req)
    from automlperf.train.data import DataError

    for name, item in ITEMS:
        started = time.monotonic()
        try:
            check = item(node, shape)
        except DataError as exc:  # its message names the problem and the fix
            check = Check(name, "fail", str(exc).splitlines()[0][:500],
                          "repair the data folder (the line above says how)")
        except Exception as exc:  # noqa: BLE001 - one broken item must not hide the others
            check = Check(name, "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                          "an unexpected error; the other items still ran")
        check.seconds = round(time.monotonic() - started, 1)
        report.checks.append(check)
        report.path.write_text(json.dumps(report.to_dict(), indent=2))
        if on_check is not None:
            on_check(check)
    return report


def _devices(node: _Node, shape: Shape) -> Check:
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


def _ceiling(node: _Node, shape: Shape) -> Check:
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


def _train(node: _Node, shape: Shape, name: str, channels_last: bool, compile: bool) -> Check:
    """The seed model training alone on synthetic images, through the engine's own ranks."""
    from automlperf.config import load_config, set_option
    from automlperf.graph import seeds
    from automlperf.hardware import accelerator_memory_gib
    from automlperf.ops import count
    from automlperf.train.single import TrainRequest, plan_training, train_planned

    ranks = len(node.devices)
    per_device = node.req.quick and 16 or (
        32 if not node.accelerated else
        load_config(None, "synthetic", {}).train.per_device_batch(accelerator_memory_gib()))
    steps = 2 if not node.accelerated else 30
    tree: dict[str, Any] = {}
    set_option(tree, "data.image_size", shape.image_size)
    set_option(tree, "data.synthetic_images", per_device * ranks * steps)
    set_option(tree, "data.synthetic_classes", shape.classes)
    set_option(tree, "train.precision", node.req.precision)
    set_option(tree, "train.channels_last", channels_last)
    set_option(tree, "train.compile", compile)
    set_option(tree, "train.warmup_epochs", 0.0)
    cfg = load_config(None, "synthetic", tree)
    plan = plan_training(TrainRequest(cfg, model=shape.model, epochs=2,
                                      batch_size=per_device * ranks, devices=ranks))
    result = train_planned(plan)
    if result.outcome.status != "completed" or not result.epochs:
        return Check(name, "fail", f"training failed: {result.outcome.reason}",
                     "run `automlperf train --model resnet50 --dataset synthetic` to see why")
    last = result.epochs[-1]  # the first epoch carries the warm-up (and the compilation)
    ops = count(seeds.seed(shape.model, shape.classes, shape.image_size, 3))
    per_image = ops.forward + ops.backward_grad
    step_ops = last.images_per_s * per_image + ops.update_per_step * last.steps / max(
        1e-9, last.train_images / max(last.images_per_s, 1e-9))
    epoch_ops = last.ops / max(1e-9, last.ended_at - last.started_at)
    fraction = step_ops / node.ceiling_ops if node.ceiling_ops else None
    node.rates[name] = last.images_per_s
    if not compile and (channels_last == node.channels_last or node.train_images_per_s is None):
        node.train_images_per_s = last.images_per_s
    figures = {"model": shape.model, "image_size": shape.image_size, "batch": last.batch_size,
               "precision": last.precision, "images_per_s": last.images_per_s,
               "step_ops_per_s": step_ops, "epoch_ops_per_s": epoch_ops,
               "fraction_of_ceiling": fraction, "data_share": last.data_share,
               "first_epoch_s": result.epochs[0].ended_at - result.epochs[0].started_at,
               "compile": compile, "channels_last": channels_last, **{
                   k: v for k, v in result.outcome.extra.items()
                   if k in ("compiled_graphs", "compile_fallback")}}
    summary = (f"{shape.model} at {shape.image_size}, batch {last.batch_size}, "
               f"{last.precision}: {last.images_per_s:.1f} img/s, {step_ops / 1e12:.3g} TOPS in "
               "steps" + (f" = {fraction:.2g} of the ceiling" if fraction else ""))
    if compile and result.outcome.extra.get("compile_fallback"):
        return Check(name, "warn", summary, str(result.outcome.extra["compile_fallback"]), figures)
    slower = _layout_advice(node, last.images_per_s, channels_last, compile)
    if slower:
        return Check(name, "warn", summary, slower, figures)
    low = _low_fraction_advice(node, fraction, channels_last)
    if low:
        return Check(name, "warn", summary, low, figures)
    gain = _compile_gain(node, last.images_per_s, figures["first_epoch_s"]) if compile else ""
    return Check(name, "pass", summary, gain, figures)


def _eager_rate(node: _Node) -> float | None:
    """Images/s of uncompiled training in the layout a run trains in, once measured."""
    return node.rates.get("train channels_last" if node.channels_last else "train eager")


def _compile_gain(node: _Node, rate: float, first_epoch_s: float) -> str:
    """What torch.compile would gain, where it trains clearly faster than eager in the run's
    layout: off by default because every trial of a search is a new architecture, compiled
    anew, so it repays only where trials are long."""
    eager = _eager_rate(node)
    if not eager or rate < eager * (1 + COMPILE_GAIN):
        return ""
    return (f"torch.compile trains {rate / eager - 1:.0%} faster here ({rate:.3g} against "
            f"{eager:.3g} img/s), after compiling each new architecture (the first epoch took "
            f"{first_epoch_s:.0f} s): set train.compile = true where trials last long enough "
            "to repay it")


def _low_fraction_advice(node: _Node, fraction: float | None, channels_last: bool) -> str:
    """What to try when training reaches too little of the ceiling, judged in the layout a
    run trains in (the other layout's figure is there to compare); empty otherwise."""
    limit = TRAIN_FRACTION_WARN["accelerator" if node.accelerated else "cpu"]
    if fraction is None or fraction >= limit or channels_last != node.channels_last:
        return ""
    return (f"below {limit:.2f} of the ceiling: the train items here compare channels_last "
            "and torch.compile; a larger train.batch_size may also help")


def _layout_advice(node: _Node, rate: float, channels_last: bool, compile: bool) -> str:
    """What to set when torch.compile is slower here than eager training in the run's
    layout, or when the other layout is faster than the run's default; empty otherwise."""
    standard = node.rates.get("train eager")
    if compile:
        eager = _eager_rate(node)
        if eager and rate < eager:
            return (f"torch.compile is slower than eager here ({rate:.3g} against {eager:.3g} "
                    "img/s): keep train.compile = false")
        return ""
    if not channels_last or not standard:
        return ""
    words = f"{rate:.3g} against {standard:.3g} img/s in the standard layout"
    if rate < standard and node.channels_last:
        return f"channels_last, the default here, is slower ({words}): set train.channels_last = false"
    if rate > standard and not node.channels_last:
        return f"channels_last is faster here ({words}): set train.channels_last = true"
    return ""


def _train_eager(node: _Node, shape: Shape) -> Check:
    return _train(node, shape, "train eager", channels_last=False, compile=False)


def _train_channels_last(node: _Node, shape: Shape) -> Check:
    return _train(node, shape, "train channels_last", channels_last=True, compile=False)


def _train_compiled(node: _Node, shape: Shape) -> Check:
    if node.req.quick:
        return Check("train compiled", "skip", "not in quick mode (compilation takes minutes)")
    return _train(node, shape, "train compiled", channels_last=node.channels_last, compile=True)


def _probe(shape: Shape, batch: int, device: str, node: _Node) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "automlperf.train.memprobe", "--model", shape.model,
           "--image-size", str(shape.image_size), "--classes", str(shape.classes),
           "--batch", str(batch), "--device", device, "--precision", node.req.precision,
           "--threads", str(node.threads)] + (["--channels-last"] if node.channels_last else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the memory probe at batch {batch} failed: {tail[:300]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _memory(node: _Node, shape: Shape) -> Check:
    import psutil

    from automlperf.config import load_config
    from automlperf.hardware import accelerator_memory_gib

    cfg = load_config(None, "imagenet" if shape.official else "synthetic", {})
    default = cfg.train.per_device_batch(accelerator_memory_gib())
    top = int(default * cfg.search.batch_size_factors[1])
    gib = 2**30
    if node.accelerated:
        device = node.devices[0]
        at = {b: _probe(shape, b, device, node) for b in (default, top)}
        total = (accelerator_memory_gib() or 0) * gib
        figures = {"device": device, "default_batch": default, "top_batch": top,
                   "total_bytes": total, "measured": at}
        words = ", ".join(f"batch {b}: " + ("out of memory" if r["oom"] else
                                           f"{r['peak_bytes'] / gib:.1f} GiB")
                          for b, r in at.items())
        summary = f"{device}, {words} of {total / gib:.0f} GiB"
        if at[default]["oom"]:
            return Check("memory", "fail", summary, f"the default batch does not fit: set "
                         f"train.batch_size below {default}", figures)
        if at[top]["oom"]:
            return Check("memory", "warn", summary, "TPE's largest batches will run out of "
                         "memory and be retried smaller (time lost): lower "
                         "search.batch_size_factors' top", figures)
        return Check("memory", "pass", summary, figures=figures)
    # On a CPU the default batch of ResNet-50 at 224 holds gigabytes for minutes: two small
    # batches in fresh processes give the per-image cost and the fixed part.
    small = (4, 8)
    at = {b: _probe(shape, b, "cpu", node) for b in small}
    per_image = max(0.0, (at[small[1]]["peak_bytes"] - at[small[0]]["peak_bytes"]) / (small[1] - small[0]))
    fixed = at[small[0]]["peak_bytes"] - per_image * small[0]
    need = {b: fixed + per_image * b for b in (default, top)}
    ranks = len(node.devices)
    available = psutil.virtual_memory().available / ranks
    figures = {"device": "cpu", "default_batch": default, "top_batch": top,
               "measured": at, "per_image_bytes": per_image, "estimated_bytes": need,
               "available_bytes_per_rank": available}
    summary = (f"estimated from batches {small[0]} and {small[1]}: batch {default} "
               f"{need[default] / gib:.1f} GiB, batch {top} {need[top] / gib:.1f} GiB, "
               f"{available / gib:.1f} GiB available per rank")
    if need[default] > available:
        return Check("memory", "fail", summary, f"the default batch does not fit: set "
                     f"train.batch_size to about {int(available / max(per_image, 1))}", figures)
    if need[top] > available:
        return Check("memory", "warn", summary, "TPE's largest batches will run out of "
                     "memory and be retried smaller (time lost)", figures)
    return Check("memory", "pass", summary, figures=figures)


def _dataset_dir(node: _Node, shape: Shape) -> Path:
    """The site's folder, or one generated under the doctor's output folder (once)."""
    if node.req.data_dir is not None:
        return node.req.data_dir
    from automlperf.train.data.generate import write_photo_folder

    root = node.req.out / "data"
    if not (root / "val").exists():
        tmp = node.req.out / "data.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        write_photo_folder(tmp, *_generated_size(node))
        tmp.rename(root)
    return root


def _generated_size(node: _Node) -> tuple[int, int, int]:
    """(classes, training and validation images per class) of the generated folder: an epoch
    of about EPOCH_TARGET_S at the training rate measured earlier."""
    if node.req.quick:
        return 4, 12, 4
    rate = node.train_images_per_s or 1.0
    per_class = int(min(MAX_PER_CLASS, max(MIN_PER_CLASS, rate * EPOCH_TARGET_S / CLASSES)))
    return CLASSES, per_class, max(2, per_class // 4)


def _run_seconds(node: _Node, root: Path) -> float:
    """How long the short run must last to train RUN_EPOCHS epochs of ``root`` at the
    measured rate (validation images cost a third of a training image)."""
    from automlperf.train.data import DataError
    from automlperf.train.data.index import scan_image_folder

    try:
        index = scan_image_folder(root)
    except DataError:
        return node.req.run_duration_s  # the run itself says what is wrong, in its words
    rate = node.train_images_per_s or 1.0
    epoch = (index.train_size + index.val_size / 3) / rate
    return max(node.req.run_duration_s, RUN_START_S + RUN_EPOCHS * epoch)


def _decode_rate(dataset: Any, batch: int, device: str = "cpu", passes: int = 2) -> float:
    """Images per second of the last of ``passes`` training passes (the first starts the
    workers and warms the page cache), the images delivered on ``device``."""
    import torch

    from automlperf.train.trainer import synchronize

    rate = 0.0
    for epoch in range(passes):
        started, n = time.perf_counter(), 0
        for _, y in dataset.batches("train", 0, 1, batch, epoch, 0, torch.device(device)):
            n += len(y)
        synchronize(torch.device(device))
        rate = n / max(time.perf_counter() - started, 1e-9)
    dataset.release()
    return rate


def _pipeline(node: _Node, shape: Shape) -> Check:
    from automlperf.config import load_config
    from automlperf.hardware import accelerator_memory_gib
    from automlperf.train.data import (SHARED_BUDGET, ImageFolderDataset, dali_available,
                                       fit_shared_budget, shm_free)

    root = _dataset_dir(node, shape)
    size = 224 if shape.official else shape.image_size
    data = ImageFolderDataset(root, size, workers=1)
    per_core = _decode_rate(data, 32)
    ranks = len(node.devices)
    # On a GPU node each rank keeps a core for itself; on a CPU-only node training and
    # decoding share every core, and the comparison says how much of them decoding takes.
    decode_cores = max(1, node.cores - ranks) if node.accelerated else node.cores
    capacity = per_core * decode_cores
    need = node.train_images_per_s
    figures: dict[str, Any] = {"data_dir": str(root), "image_size": size,
                               "images_per_s_per_core": per_core, "decode_cores": decode_cores,
                               "capacity_images_per_s": capacity,
                               "needed_images_per_s": need, "shm_free_bytes": shm_free()}
    if dali_available():
        from automlperf.train.data import DaliImageFolderDataset

        # On the rank's GPU, as a run decodes (nvJPEG); with DALI's CPU decoders elsewhere.
        dali = DaliImageFolderDataset(root, size, workers=max(1, decode_cores // ranks))
        figures["dali_images_per_s"] = _decode_rate(dali, 32, node.devices[0])
        if node.devices[0].startswith("cuda"):
            # A run decodes with DALI on every GPU when it is installed: its capacity counts.
            capacity = max(capacity, figures["dali_images_per_s"] * ranks)
            figures["capacity_images_per_s"] = capacity
    per_rank = load_config(None, "imagenet", {}).train.per_device_batch(accelerator_memory_gib())
    try:
        fit_shared_budget(SHARED_BUDGET, per_rank, node.threads, ranks, 3 * size * size,
                          shm_free())
    except Exception as exc:  # noqa: BLE001 - the loader's own refusal, in its words
        return Check("input pipeline", "fail", f"{per_core:.0f} img/s per core", str(exc), figures)
    summary = f"{per_core:.0f} img/s per core x {decode_cores} cores" + (
        f"; DALI {figures['dali_images_per_s']:.0f} img/s per device" if "dali_images_per_s"
        in figures else "") + f"; capacity {capacity:.0f} img/s" + (
        f"; training consumes {need:.1f} img/s ({capacity / need:.1f}x)" if need else "")
    if need and capacity < need:
        return Check("input pipeline", "fail", summary, "decoding cannot feed the devices: "
                     "install DALI (pip install 'automlperf[dali]') or give each device more "
                     "cores", figures)
    if need and capacity < DECODE_HEADROOM * need:
        return Check("input pipeline", "warn", summary, "little headroom: a busier node "
                     "will starve the devices; consider DALI or more cores", figures)
    return Check("input pipeline", "pass", summary, figures=figures)


def _energy(node: _Node, shape: Shape) -> Check:
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


def _official_run(node: _Node, shape: Shape) -> Check:
    """A short `automlperf run` through the real command, then `automlperf check`."""
    from automlperf.measure.check import check_run

    root = _dataset_dir(node, shape)
    run_dir = node.req.out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "automlperf.cli", "run", "--dataset", "imagenet",
           "--data-dir", str(root), "--run-dir", str(run_dir)]
    if node.req.devices:
        cmd += ["--devices-per-replica", str(node.req.devices)]
    if node.req.quick:
        config = node.req.out / "quick.toml"
        config.write_text(
            f'[data]\ndataset = "imagenet"\ndata_dir = "{root}"\nimage_size = {shape.image_size}\n'
            '[model]\nseed_model = "resnet_small"\n'
            '[train]\nbatch_size = 16\nmax_epochs = 4\n'
            '[run]\nduration_s = 1800\nmax_rounds = 1\n')
        cmd = [sys.executable, "-m", "automlperf.cli", "run", "--config", str(config),
               "--run-dir", str(run_dir)]
    else:
        seconds = _run_seconds(node, root)
        if seconds > MAX_RUN_S:
            return Check("official run", "fail", f"{root}: {RUN_EPOCHS} epochs would take "
                         f"{seconds / 60:.0f} min at {node.train_images_per_s or 0:.3g} img/s",
                         "leave out --data-dir (the doctor generates a folder sized for this "
                         "node) or give a subset of the dataset")
        cmd += ["--duration", f"{seconds:.0f}s"]
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (node.req.out / "run.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        last = next((line for line in reversed((done.stdout + done.stderr).splitlines())
                     if line.strip()), "no output")
        return Check("official run", "fail", f"`automlperf run` exited {done.returncode}: "
                     f"{last[:300]}", f"read {node.req.out / 'run.log'}")
    result = json.loads((run_dir / "result.json").read_text())
    verdict = check_run(run_dir)
    figures = {"run_dir": str(run_dir), "score_ops": result.get("score"),
               "fraction_of_ceiling": result.get("fraction_of_ceiling"),
               "epochs": result.get("epochs"), "trials": result.get("trials"),
               "check_ok": verdict.ok, "check_mismatches": verdict.mismatches}
    fraction = result.get("fraction_of_ceiling")
    summary = (f"{'quick run' if node.req.quick else 'official shape'}: "
               f"{result.get('epochs')} epoch(s), {(result.get('score') or 0) / 1e9:.3g} GOPS"
               + (f" = {fraction:.2g} of the ceiling" if fraction else "")
               + f"; check {'passed' if verdict.ok else 'FAILED'}")
    if not verdict.ok:
        return Check("official run", "fail", summary, "; ".join(verdict.mismatches)[:300], figures)
    if not result.get("epochs"):
        return Check("official run", "fail", summary, "no epoch completed: lengthen "
                     "--run-duration", figures)
    return Check("official run", "pass", summary, figures=figures)


# In order: later items use what earlier ones measured (the ceiling, the training rate).
ITEMS: list[tuple[str, Callable[[_Node, Shape], Check]]] = [
    ("devices", _devices), ("ceiling", _ceiling), ("train eager", _train_eager),
    ("train channels_last", _train_channels_last), ("train compiled", _train_compiled),
    ("memory", _memory), ("input pipeline", _pipeline), ("energy", _energy),
    ("official run", _official_run)]
