"""The ImageNet-folder input pipeline at 224x224: the old loader and the current one side by
side in one run.

1. Images per second per decoding core (random-resized crop to 224, flip, normalised as the
   trainer receives them) over whole training passes, with 1 and 2 worker processes. "old"
   is the loader before the persistent, chunked pipeline (bench/legacy_loader.py, kept
   verbatim); "new" is automlperf's ImageFolderDataset. Passes alternate A B B A so machine
   noise hits both alike; the first pair warms the page cache (and starts the new loader's
   persistent workers, which every later epoch of a trial reuses).
2. First-batch latency of an epoch: seconds from asking for an epoch's batches to holding
   the first one, at ``--batch`` images per rank, for epochs after the first.
3. Shared and pinned memory: the peak /dev/shm use measured during the passes (decoded
   images in flight between workers and the rank), and the bound each loader's settings
   allow one rank at a configured batch (``--memory-batch`` images per rank, 224 px,
   ``--memory-workers`` workers, pinned as on a GPU).
4. ResNet-50 at 224 through the trainer on a slice of the files: its data-loading share of
   step time (the share every epoch event records).

The files are JPEGs of ImageNet's typical size (500x375, quality 90) cut from the photo
matplotlib ships (train/data/generate.py, as `automlperf doctor` writes them), written once
into a temporary folder.

Run: python bench/bench_imagenet_pipeline.py [--images 384] [--passes 6] [--batch 128]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from automlperf.graph import seeds
from automlperf.hardware import cores_available
from automlperf.train.data import ImageFolderDataset, plan_loader
from automlperf.train.data.generate import write_photo_folder
from automlperf.train.trainer import RankContext, TrialSpec, _Run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from legacy_loader import legacy_batches, legacy_memory_bound  # noqa: E402

CPU = torch.device("cpu")
SHM = "/dev/shm"


class ShmPeak:
    """The peak of /dev/shm's used bytes above its level at the start, sampled every 5 ms
    (the workers' shared tensors live there, unlinked but counted)."""

    def __init__(self) -> None:
        self.base = shutil.disk_usage(SHM).used
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, shutil.disk_usage(SHM).used - self.base)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def timed_pass(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, float, float, int]:
    """(images, seconds, first-batch seconds, peak shared bytes) of one pass."""
    shm = ShmPeak()
    t0 = time.perf_counter()
    first = None
    n = 0
    for _, y in batches:
        if first is None:
            first = time.perf_counter() - t0
        n += len(y)
    seconds = time.perf_counter() - t0
    return n, seconds, first or seconds, shm.stop()


def resnet50_share(root: Path, train_images: int, out: dict[str, object]) -> None:
    """ResNet-50 at 224 through the trainer on a small slice of the same files."""
    sub = root / "slice"
    for split in ("train", "val"):
        for f in sorted((root / split).rglob("*.JPEG"))[: train_images if split == "train" else 8]:
            dst = sub / split / f.parent.name / f.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(f)
    torch.set_num_threads(max(1, cores_available() - 1))
    ds = ImageFolderDataset(sub, 224, workers=1)
    graph = seeds.resnet50(num_classes=ds.num_classes, image_size=224)
    spec = TrialSpec("bench", graph.to_dict(), epochs=1, batch_size=16, patience=2)
    run = _Run(spec, RankContext(0, 1, CPU, ds), graph)
    _, images, steps, wait, _, seconds = run.train_epoch(0, lambda kind, msg: None)
    ds.release()
    out.update(resnet50_images_per_s=round(images / seconds, 3),
               resnet50_data_share=round(wait / seconds, 4), resnet50_steps=steps)
    print(f"ResNet-50 at 224, batch 16, {images} images: {images / seconds:.2f} img/s, data "
          f"loading {100 * wait / seconds:.1f} % of step time ({steps} steps)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=384)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--batch", type=int, default=128, help="images per rank and step")
    ap.add_argument("--memory-batch", type=int, default=1112)
    ap.add_argument("--memory-workers", type=int, default=8)
    ap.add_argument("--train-images", type=int, default=48, help="ResNet-50 epoch size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out: dict[str, object] = {"bench": "imagenet_pipeline", "cores": cores_available(),
                              "batch": args.batch, "images": args.images}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_photo_folder(root, 8, args.images // 8, args.images // 8)
        for workers in (1, 2):
            new = ImageFolderDataset(root, 224, workers)
            items = new.index.items("train")
            runs: dict[str, Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]]] = {
                "old": lambda epoch, w=workers, it=items: legacy_batches(it, "train", 0, 1, args.batch,
                                                               epoch, 0, 224, w, CPU),
                "new": lambda epoch, ds=new: ds.batches("train", 0, 1, args.batch, epoch, 0, CPU)}
            rates: dict[str, list[float]] = {"old": [], "new": []}
            firsts: dict[str, list[float]] = {"old": [], "new": []}
            shm: dict[str, int] = {"old": 0, "new": 0}
            for p in range(args.passes):
                for name in (("old", "new") if p % 2 == 0 else ("new", "old")):
                    n, s, first, peak = timed_pass(runs[name](p))
                    if p >= 2:  # the first pair warms the page cache and starts workers
                        rates[name].append(n / s / workers)
                        firsts[name].append(first)
                        shm[name] = max(shm[name], peak)
            new.release()
            ratio = statistics.median(a / b for a, b in zip(rates["new"], rates["old"]))
            row = {"workers": workers,
                   "old_img_s_per_core": statistics.median(rates["old"]),
                   "new_img_s_per_core": statistics.median(rates["new"]), "ratio": ratio,
                   "old_first_batch_s": statistics.median(firsts["old"]),
                   "new_first_batch_s": statistics.median(firsts["new"]),
                   "old_peak_shm_mib": shm["old"] / 2**20, "new_peak_shm_mib": shm["new"] / 2**20}
            rows.append(row)
            out[f"{workers}w"] = {k: round(v, 3) for k, v in row.items()}

        image_bytes = 224 * 224 * 3
        old_bound = legacy_memory_bound(args.memory_batch, args.memory_workers, 224)
        new_plan = plan_loader(args.memory_batch, args.memory_workers, image_bytes, pinned=True)
        out["memory_bound"] = {
            "batch": args.memory_batch, "workers": args.memory_workers,
            "old_shared_gib": round(old_bound["shared_bytes"] / 2**30, 3),
            "old_pinned_gib": round(old_bound["pinned_bytes"] / 2**30, 3),
            "new_shared_gib": round(new_plan.shared_bytes / 2**30, 3),
            "new_pinned_gib": round(new_plan.pinned_bytes / 2**30, 3),
            "new_chunk": new_plan.chunk, "new_prefetch": new_plan.prefetch}

        if args.train_images:
            resnet50_share(root, args.train_images, out)

    print(f"{'workers':>7} {'old img/s/core':>15} {'new img/s/core':>15} {'ratio':>6} "
          f"{'old 1st batch s':>16} {'new 1st batch s':>16} {'old shm MiB':>12} {'new shm MiB':>12}")
    for r in rows:
        print(f"{r['workers']:>7} {r['old_img_s_per_core']:>15.1f} {r['new_img_s_per_core']:>15.1f} "
              f"{r['ratio']:>6.2f} {r['old_first_batch_s']:>16.3f} {r['new_first_batch_s']:>16.3f} "
              f"{r['old_peak_shm_mib']:>12.1f} {r['new_peak_shm_mib']:>12.1f}")
    mb = out["memory_bound"]
    assert isinstance(mb, dict)
    print(f"bound at batch {mb['batch']} x 224 px, {mb['workers']} workers: shared old "
          f"{mb['old_shared_gib']} GiB / new {mb['new_shared_gib']} GiB; pinned old "
          f"{mb['old_pinned_gib']} GiB / new {mb['new_pinned_gib']} GiB")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
