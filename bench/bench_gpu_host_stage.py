"""The GPU decoding path's host-side cost on a CPU, before and after its host stage moved to
worker processes: the thread-based loader (bench/legacy_gpu_loader.py) and the current one
(train/data/gpuring.py + gpudecode.py), side by side in one run, on the same folder.

Nothing is decoded or resampled for real. Behind the decoder seam a stand-in reads each
file's header and answers an uninitialised image of its size (its own time is taken out of
every figure), so what is timed is Python, numpy and PyTorch's dispatch: what the rank pays
on a GPU host, besides the kernels' launch (reported as the PyTorch operations per step).

1. The device stage of one 256-image step alone, old and new: on CPU tensors of tiny
   (about 12x9) JPEGs resampled to 4 px, so that arithmetic costs next to nothing: host CPU
   milliseconds per step (goal: under 2) and PyTorch operations per step, views apart.
2. The whole loader on the folder, on PyTorch's ``meta`` device (shapes only: no arithmetic,
   and no value can be read back, so a hidden host-device wait would raise), beside a
   synthetic training thread that holds the interpreter lock as eager steps do
   (``--gil-ms`` of pure Python in every ``--step-ms``, the rest asleep, as a step waiting
   for its GPU work) and alone. Per loader, over ``--passes`` training passes after one that
   warms the page cache:

   * host stage: CPU microseconds per image (old: the reader threads' own CPU time in
     ``prepare``; new: the workers' CPU time, from their answers). Goal: under 100 us (1 core
     per 10,000 img/s);
   * device stage: the producer thread's CPU milliseconds per step in it (the stand-in's
     taken out; on ``meta`` some kernels are written in Python, so this overstates what a
     GPU's would cost) and its wall time;
   * the rank process's CPU microseconds per image besides the training thread;
   * images per second delivered to the training thread.

Run: PYTHONPATH=src python bench/bench_gpu_host_stage.py /tmp/tex500 [--workers 2]
     [--batch 256] [--passes 3] [--gil-ms 15] [--step-ms 50] [--out FILE]
where /tmp/tex500 comes from `python bench/textured_folder.py /tmp/tex500 --classes 10
--train 128 --val 16 --size 500x375` (about 100 KB files, ImageNet's weight).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from automlperf.train.data import gpudecode, jpeghead

sys.path.insert(0, str(Path(__file__).resolve().parent))
import legacy_gpu_loader as legacy  # noqa: E402

META = torch.device("meta")


class MetaStandIn:
    """Behind the seam: each file's header read, an uninitialised image of its size answered
    on the device asked for (meta here). Keeps its own time, which the stage's is net of."""

    name = "meta-stand-in"

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.busy = False  # inside decode: operations dispatched now are the stand-in's

    def versions(self) -> dict[str, str]:
        return {}

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        began, cpu = time.perf_counter(), time.thread_time()
        self.busy = True
        out = []
        for f in files:
            head = jpeghead.parse(memoryview(f.numpy()))
            assert head is not None
            out.append(torch.empty((3, head.height, head.width), dtype=torch.uint8, device=device))
        self.busy = False
        self.cpu_s += time.thread_time() - cpu
        self.wall_s += time.perf_counter() - began
        return out


class Timed:
    """Wraps a function: its calls' CPU time (the calling thread's) and wall time."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls, self.cpu_s, self.wall_s = fn, 0, 0.0, 0.0
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kw: Any) -> Any:
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*args, **kw)
        finally:
            with self.lock:
                self.calls += 1
                self.cpu_s += time.thread_time() - cpu
                self.wall_s += time.perf_counter() - began


class Burner(threading.Thread):
    """A training thread: ``gil_ms`` of pure Python (holding the interpreter lock as eager
    steps' dispatch does) in every ``step_ms``, asleep for the rest."""

    def __init__(self, gil_ms: float, step_ms: float) -> None:
        super().__init__(daemon=True, name="synthetic-training")
        self.gil_s, self.step_s = gil_ms / 1000, step_ms / 1000
        self.stop = threading.Event()
        self.cpu_s = 0.0

    def run(self) -> None:
        cpu = time.thread_time()
        while not self.stop.is_set():
            began = time.perf_counter()
            x = 0
            while time.perf_counter() - began < self.gil_s:
                for i in range(200):
                    x += i * i
            self.stop.wait(max(0.0, self.step_s - (time.perf_counter() - began)))
        self.cpu_s = time.thread_time() - cpu


class OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    """PyTorch operations dispatched, less the stand-in decoder's own (two an image: its
    ``numpy()`` view and its empty image), in two kinds: views and metadata, which launch
    nothing on a GPU, and the others (allocations and arithmetic, most a kernel launch
    there)."""

    VIEWS = frozenset({"view", "_unsafe_view", "unsqueeze", "select", "slice", "expand",
                       "transpose", "permute", "detach", "split_with_sizes", "lift_fresh",
                       "as_strided", "alias", "squeeze", "t"})

    def __init__(self, decoder: MetaStandIn) -> None:
        super().__init__()
        self.decoder = decoder
        self.views = self.others = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.decoder.busy:
            if func.overloadpacket.__name__ in self.VIEWS:
                self.views += 1
            else:
                self.others += 1
        return func(*args, **(kwargs or {}))


def measure(kind: str, root: Path, args: argparse.Namespace, burn: bool) -> dict[str, Any]:
    decoder = MetaStandIn()
    if kind == "old":
        stage = Timed(legacy.decode_step)
        legacy.decode_step = stage
        host = Timed(legacy.prepare)
        legacy.prepare = host
        ds: Any = legacy.LegacyGpuImageFolderDataset(root, 224, args.workers, decoder=decoder)
    else:
        stage = Timed(gpudecode.decode_slot)
        gpudecode.decode_slot = stage
        ds = gpudecode.GpuImageFolderDataset(root, 224, args.workers, decoder=decoder)
    try:
        loader = ds.loader(0, 1, args.batch, 0, META)
        for _ in loader.passes("train", 0):  # warm: page cache, workers, allocators
            pass
        before = (stage.calls, stage.cpu_s, stage.wall_s, decoder.cpu_s, decoder.wall_s,
                  host.cpu_s if kind == "old" else 0.0)
        worker_cpu = sum(w.cpu_seconds for w in loader.stats.workers) if kind == "new" else 0.0
        burner = Burner(args.gil_ms, args.step_ms) if burn else None
        if burner:
            burner.start()
        images, t0, cpu0 = 0, time.perf_counter(), time.process_time()
        for epoch in range(1, args.passes + 1):
            for _x, y, _, _ in loader.passes("train", epoch):
                images += len(y)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if burner:
            burner.stop.set()
            burner.join()
        steps = stage.calls - before[0]
        stage_cpu = (stage.cpu_s - before[1]) - (decoder.cpu_s - before[3])
        stage_wall = (stage.wall_s - before[2]) - (decoder.wall_s - before[4])
        if kind == "old":
            host_cpu = host.cpu_s - before[5]
        else:
            host_cpu = sum(w.cpu_seconds for w in loader.stats.workers) - worker_cpu
        return {
            "images": images, "steps": steps, "images_per_s": images / wall,
            "host_stage_cpu_us_per_image": 1e6 * host_cpu / images,
            "device_stage_cpu_ms_per_step": 1e3 * stage_cpu / steps,
            "device_stage_wall_ms_per_step": 1e3 * stage_wall / steps,
            "rank_cpu_us_per_image_besides_training":
                1e6 * (cpu - (burner.cpu_s if burner else 0.0)) / images,
        }
    finally:
        ds.release()
        if kind == "old":
            legacy.decode_step, legacy.prepare = stage.fn, host.fn
        else:
            gpudecode.decode_slot = stage.fn


class CpuStandIn(MetaStandIn):
    """The stand-in answering uninitialised CPU images (their values are never looked at)."""

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return super().decode(files, torch.device("cpu"))


def tiny_files(where: Path, n: int) -> list[str]:
    """``n`` JPEGs of about 12x9 pixels: a step whose arithmetic costs next to nothing."""
    from automlperf.train.data.generate import photo

    where.mkdir(parents=True, exist_ok=True)
    src, paths = photo(), []
    for i in range(n):
        path = where / f"{i}.JPEG"
        if not path.exists():
            src.crop((i, i, i + 12 + i % 7, i + 9 + i % 5)).save(path, quality=90)
        paths.append(str(path))
    return paths


def one_step(kind: str, paths: list[str], size: int) -> dict[str, Any]:
    """One step's device stage alone in this thread, on CPU tensors of tiny images (so that
    what is timed is Python, numpy and PyTorch's dispatch, not arithmetic), the host stage
    done beforehand: its CPU milliseconds (the stand-in's taken out) and the PyTorch
    operations it dispatches (each a kernel launch or more on a GPU)."""
    from automlperf.train.data.gpuring import stage_files

    decoder, cpu_device = CpuStandIn(), torch.device("cpu")
    if kind == "old":
        items = [legacy.prepare(p, i, 0, True, 0, 0, size) for i, p in enumerate(paths)]

        def run() -> None:
            legacy.decode_step(items, decoder, cpu_device, size, True, 0, 0, paths)
    else:
        ring = stage_files(paths, size, True)

        def run() -> None:
            gpudecode.decode_slot(ring, 0, len(paths), decoder, cpu_device)
    run()
    counter = OpCount(decoder)
    with counter:
        run()
    repeats = 20
    decoder.cpu_s = 0.0
    cpu = time.thread_time()
    for _ in range(repeats):
        run()
    net = (time.thread_time() - cpu - decoder.cpu_s) / repeats
    return {"images": len(paths), "cpu_ms_per_step": 1e3 * net,
            "torch_ops_per_step": counter.views + counter.others,
            "torch_views_per_step": counter.views, "torch_launching_ops_per_step": counter.others,
            "stand_in_ms_per_step": 1e3 * decoder.cpu_s / repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--gil-ms", type=float, default=15.0)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    files = sorted((args.folder / "train").glob("*/*"))
    result: dict[str, Any] = {
        "folder": str(args.folder), "train_files": len(files),
        "mean_file_bytes": sum(f.stat().st_size for f in files) / len(files),
        "cores": os.cpu_count(), "load_average": os.getloadavg(), "args": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    torch.set_num_threads(1)  # as a rank runs (train/rankenv.py)
    tiny = tiny_files(Path(tempfile.gettempdir()) / "automlperf-tiny-jpegs", args.batch)
    for kind in ("old", "new"):
        result[f"{kind}_one_step"] = one_step(kind, tiny, 4)
        print(f"{kind}_one_step", json.dumps(result[f"{kind}_one_step"]), flush=True)
    for burn in (False, True):
        for kind in ("old", "new"):
            label = f"{kind}_{'beside_training' if burn else 'alone'}"
            result[label] = measure(kind, args.folder, args, burn)
            print(label, json.dumps({k: round(v, 2) for k, v in result[label].items()}),
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
