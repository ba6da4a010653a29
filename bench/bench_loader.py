"""Does the rank's image-folder loader deliver what its workers decode? The loader before the
shared queue and the ring of batch slots (bench/legacy_chunk_loader.py) and the current one,
side by side in one run, on 500x375 JPEGs at 224 px, with a rank that asks for batches faster
than they can be decoded:

1. Delivered over decoded: images per second the rank receives, over the rate its workers
   decode at while decoding (each worker's images over its seconds inside its chunks, summed),
   measured in the same rounds (a training pass, then validation, as an epoch runs them).
   1.0 means no worker ever waited. Rounds alternate old/new so machine noise hits both alike;
   the first pair warms the page cache and starts workers. Also per round: the spread of the
   workers' own rates (slowest over fastest), and the seconds from the end of the training
   pass to validation's first batch.
2. The rank's side with decoding stubbed out (workers write a constant, read nothing): the
   rank's CPU microseconds, minor page faults and file descriptors received per batch, and
   the images per second the rank can take at most, at 1 and 2 intra-op threads.
3. A simulated device faster than the loader (each step waits images / ``--device-factor``
   x the workers' measured decoding rate): the data share of its epochs through the trainer's
   own accounting (train_epoch), old and new.

Run: python bench/bench_loader.py [--images 256] [--passes 6] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from automlperf.graph import seeds
from automlperf.train.data import CHUNK_IMAGES, ImageFolderDataset, ring
from automlperf.train.data.generate import write_photo_folder
from automlperf.train.trainer import RankContext, TrialSpec, _Run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from legacy_chunk_loader import LegacyChunkLoader, stub_decode  # noqa: E402

CPU = torch.device("cpu")
SIZE = 224


class _FdCount:
    """File descriptors the rank receives from workers (torch's shared-memory hand-over):
    each one is rebuilt into a storage by the function counted here, which workers name
    when they send one."""

    count = 0

    def __init__(self) -> None:
        import torch.multiprocessing.reductions as reductions

        _FdCount.real = reductions.rebuild_storage_fd
        reductions.rebuild_storage_fd = counted_rebuild  # type: ignore[assignment]


def counted_rebuild(*args: Any) -> Any:
    _FdCount.count += 1
    return _FdCount.real(*args)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _worker_rates(per_worker: dict[int, list[float]]) -> list[float]:
    """Each worker's images per second while decoding: per_worker[w] = [images, seconds]."""
    return [images / seconds for images, seconds in per_worker.values() if seconds > 0]


def _round(loader: Any, epoch: int, new: bool, fds: _FdCount, splits: tuple[str, ...]
           ) -> dict[str, float]:
    """A training pass then validation, as an epoch runs them, asked for as fast as the rank
    can: what was delivered, what the workers decoded, and the rank's own cost. The new
    loader decodes nothing after the round (so it takes nothing from the old loader's)."""
    if new:
        before = [(w.images, w.seconds) for w in loader.stats.workers]
    else:
        logged = len(loader.chunk_log)
    cpu, faults, fd0 = time.thread_time(), _faults(), fds.count
    began = time.perf_counter()
    images = batches = 0
    first = 0.0  # seconds from the end of the training pass to validation's first batch
    for i, split in enumerate(splits):
        if new and i == len(splits) - 1:
            loader.expect(None)
        asked = time.perf_counter()
        for _, labels, _, _ in loader.passes(split, epoch if split == "train" else 0):
            if i and not first:
                first = time.perf_counter() - asked
            images += len(labels)
            batches += 1
    wall = time.perf_counter() - began
    per_worker: dict[int, list[float]] = {}
    if new:
        for i, (w, (n0, s0)) in enumerate(zip(loader.stats.workers, before)):
            per_worker[i] = [w.images - n0, w.seconds - s0]
    else:
        for worker, n, seconds in loader.chunk_log[logged:]:
            entry = per_worker.setdefault(worker, [0, 0.0])
            entry[0] += n
            entry[1] += seconds
    rates = _worker_rates(per_worker)
    return {"delivered": images / wall, "decoded": sum(rates),
            "spread": min(rates) / max(rates) if rates else 1.0,
            "rank_cpu_us_per_batch": 1e6 * (time.thread_time() - cpu) / batches,
            "faults_per_batch": (_faults() - faults) / batches,
            "fds_per_batch": (fds.count - fd0) / batches, "val_first_batch_s": first}


def _loaders(root: Path, workers: int, batch: int, stub: bool, chunk: int
             ) -> tuple[Any, Any, Any]:
    """(old loader, new loader, the dataset holding the new one)."""
    ds = ImageFolderDataset(root, SIZE, workers, chunk_images=chunk)
    real = ring.decode_file
    if stub:
        ring.decode_file = stub_decode  # before the workers fork
    try:
        new = ds.loader(0, 1, batch, 0, CPU)
    finally:
        ring.decode_file = real
    old = LegacyChunkLoader(ds.index, SIZE, workers, batch, 0, CPU,
                            decode=stub_decode if stub else ring.decode_file)
    return old, new, ds


def delivered_over_decoded(root: Path, workers: int, batch: int, passes: int,
                           fds: _FdCount, chunk: int) -> dict[str, Any]:
    old, new, ds = _loaders(root, workers, batch, stub=False, chunk=chunk)
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    try:
        for p in range(passes):
            for name in (("old", "new") if p % 2 == 0 else ("new", "old")):
                figures = _round(old if name == "old" else new, p, name == "new", fds,
                                 ("train", "val"))
                if p >= 2:
                    runs[name].append(figures)
    finally:
        old.close()
        ds.release()
    out: dict[str, Any] = {"workers": workers}
    for name, rows in runs.items():
        out[name] = {key: round(statistics.median(r[key] for r in rows), 4) for key in rows[0]}
        out[name]["ratio"] = round(statistics.median(r["delivered"] / r["decoded"] for r in rows), 4)
    return out


def rank_side(root: Path, workers: int, batch: int, passes: int, fds: _FdCount,
              chunk: int) -> dict[str, Any]:
    """Decoding stubbed out: what the rank itself costs per batch, at 1 and 2 threads."""
    out: dict[str, Any] = {"workers": workers}
    threads = torch.get_num_threads()
    try:
        for rank_threads in (1, 2):
            torch.set_num_threads(rank_threads)
            old, new, ds = _loaders(root, workers, batch, stub=True, chunk=chunk)
            try:
                for name, loader in (("old", old), ("new", new)):
                    rows = [_round(loader, p, name == "new", fds, ("train",))
                            for p in range(passes)][2:]
                    out[f"{name}_{rank_threads}t"] = {
                        key: round(statistics.median(r[key] for r in rows), 2)
                        for key in ("delivered", "rank_cpu_us_per_batch", "faults_per_batch",
                                    "fds_per_batch")}
            finally:
                old.close()
                ds.release()
    finally:
        torch.set_num_threads(threads)
    return out


class _LegacyDataset(ImageFolderDataset):
    """The dataset served by the old loader."""

    def _new_loader(self, rank: int, world: int, per_rank: int, seed: int,
                    device: torch.device) -> Any:
        loader = LegacyChunkLoader(self.index, self.image_size, self.workers, per_rank, seed,
                                   device)
        loader.key = lambda: (rank, world, per_rank, seed, device)  # type: ignore[method-assign]
        return loader


def data_share(root: Path, workers: int, batch: int, rate: float, chunk: int
               ) -> dict[str, float]:
    """Epochs through the trainer's accounting, the device simulated at ``rate`` img/s."""
    out = {}
    for name, cls in (("old", _LegacyDataset), ("new", ImageFolderDataset)):
        ds = cls(root, SIZE, workers, chunk_images=chunk)
        graph = seeds.resnet_small(num_classes=ds.num_classes, image_size=SIZE)
        spec = TrialSpec("bench", graph.to_dict(), epochs=3, batch_size=batch, patience=9)
        run = _Run(spec, RankContext(0, 1, CPU, ds), graph)

        def simulated_device(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            time.sleep(len(y) / rate)
            return torch.zeros(())

        run._step = simulated_device  # type: ignore[method-assign]
        shares = []
        ds.loader(0, 1, batch, 0, CPU)
        try:
            for epoch in range(3):
                ds.expect_next(("train", epoch + 1))  # no validation between (old: no-op)
                times = run.train_epoch(epoch, lambda kind, msg: None)
                shares.append(times.data_wait / times.seconds)
        finally:
            ds.release()
            if hasattr(ds._loader, "close"):
                ds._loader.close()
        out[name] = round(statistics.median(shares[1:]), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64, help="images per rank and step")
    ap.add_argument("--chunk", type=int, default=CHUNK_IMAGES,
                    help="the new loader's most images per task")
    ap.add_argument("--device-factor", type=float, default=2.0,
                    help="the simulated device's rate over the workers' decoding rate")
    args = ap.parse_args()
    torch.set_num_threads(2)  # a CPU rank on this machine: its cores
    fds = _FdCount()
    out: dict[str, Any] = {"bench": "loader", "batch": args.batch, "images": args.images,
                           "size": SIZE, "chunk": args.chunk}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_photo_folder(root, 8, args.images // 8, args.images // 32)
        for workers in (1, 2):
            ratio = delivered_over_decoded(root, workers, args.batch, args.passes, fds, args.chunk)
            out[f"{workers}w"] = ratio
            old, new = ratio["old"], ratio["new"]
            print(f"{workers} worker(s): delivered/decoded old {old['ratio']:.3f} "
                  f"({old['delivered']:.0f}/{old['decoded']:.0f} img/s, spread "
                  f"{old['spread']:.2f}, validation's first batch after "
                  f"{old['val_first_batch_s']:.3f} s), new {new['ratio']:.3f} "
                  f"({new['delivered']:.0f}/{new['decoded']:.0f} img/s, spread "
                  f"{new['spread']:.2f}, {new['val_first_batch_s']:.3f} s)", flush=True)
            rank = rank_side(root, workers, args.batch, args.passes, fds, args.chunk)
            out[f"{workers}w_rank_side"] = rank
            for key, row in rank.items():
                if key != "workers":
                    print(f"  stubbed, {key}: {row}", flush=True)
            rate = args.device_factor * new["decoded"]
            share = data_share(root, workers, args.batch, rate, args.chunk)
            out[f"{workers}w_data_share"] = {"device_img_s": round(rate, 1), **share}
            print(f"  simulated device at {rate:.0f} img/s: data share old {share['old']:.3f}, "
                  f"new {share['new']:.3f}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
