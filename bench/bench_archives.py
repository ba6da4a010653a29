"""ImageNet read from its official archives: what the one pass costs, what the index holds, and
what the CPU loader delivers from an archive against the same images as a folder.

1. The pass (MD5 and index together, dataset/archive.py scan_archives) over archives written
   from a folder of ImageNet-weight JPEGs (bench/textured_folder.py at 500x375: about
   ImageNet's bytes per image, so the headers per gigabyte are ImageNet's): seconds per GB,
   wall and CPU, with the archives in the page cache (warm) and with their pages dropped
   first (cold: this machine's disk); hashlib's MD5 alone over the same bytes, for its share;
   both extrapolated to the real archives' 154.6 GB.
2. The index at ImageNet-1k's 1,331,167 rows, its names as ImageNet's: the bytes of each
   array, and the memory a process that maps it uses once it has read every label, offset
   and size (what the readers touch).
3. The CPU loader: a training and a validation pass at 224 px, 1 and 2 decoding workers,
   archive against folder in alternating rounds (the first, warming the page cache, not
   counted), each timed from its first batch: images per second, and per worker.
4. The system calls of an epoch (strace -f -c of one and of three epochs, the difference
   halved): opens and stat calls, archive against folder.

Run: python bench/bench_archives.py [--dir DIR] [--classes 100] [--train 70] [--val 10]
     [--rounds 3] [--loader-train 40] [--loader-val 10] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from automlperf import rules
from automlperf.dataset.archive import NAMES, scan_archives
from automlperf.dataset.index import ARCHIVES, FileIndex
from automlperf.testing.archives import write_archives

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from textured_folder import write_textured_folder  # noqa: E402

# The official archives' sizes (image-net.org's ILSVRC-2012 downloads).
REAL_BYTES = 147_897_477_120 + 6_744_924_160 + 2_568_145
SIZE = 224
BATCH = 64
CALLS = "open,openat,stat,lstat,fstat,newfstatat,statx,read,pread64,readv,preadv"


def drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def the_pass(archives: Path, cold: bool) -> dict[str, float]:
    if cold:
        for name in NAMES.values():
            drop_pages(archives / name)
    cpu, wall = time.process_time(), time.perf_counter()
    found = scan_archives(archives)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gb = found.bytes / 1e9
    return {"gb": gb, "images": len(found.index), "wall_s_per_gb": wall / gb,
            "cpu_s_per_gb": cpu / gb}


def md5_alone(archives: Path) -> float:
    """CPU seconds per GB of hashlib's MD5 over the archives' bytes, already read."""
    total, cpu = 0, 0.0
    for name in NAMES.values():
        data = (archives / name).read_bytes()
        began = time.process_time()
        hashlib.md5(data).hexdigest()
        cpu += time.process_time() - began
        total += len(data)
    return cpu / (total / 1e9)


def imagenet_index(folder: Path) -> dict[str, Any]:
    """An index of ImageNet-1k's shape (names as ImageNet's: ``n01440764_10026.JPEG``,
    ``ILSVRC2012_val_00000001.JPEG``), saved; each array's bytes."""
    ds = rules.IMAGENET_1K
    rng = np.random.default_rng(0)
    rows: dict[str, list[tuple[Any, ...]]] = {"train": [], "val": []}
    at = 0
    per_class = np.full(1000, ds.train_images // 1000)
    per_class[:ds.train_images % 1000] += 1
    for c, wnid in enumerate(ds.classes):
        for number in rng.choice(60_000, int(per_class[c]), replace=False):
            size = int(rng.integers(20_000, 200_000))
            rows["train"].append((f"train/{wnid}/{wnid}_{number}.JPEG", c, at, size))
            at += size + 1024
    for i in range(ds.val_images):
        c = i % 1000
        rows["val"].append((f"val/{ds.classes[c]}/ILSVRC2012_val_{i + 1:08d}.JPEG", c, i * 131_072,
                            120_000))
    index = FileIndex.from_rows("/data", list(ds.classes), rows, ARCHIVES,
                                archives={"train": NAMES["train"], "val": NAMES["val"]})
    index.save(folder)
    arrays = {p.name: p.stat().st_size for p in sorted(folder.glob("*.npy"))}
    return {"rows": len(index), "array_bytes": arrays, **index.nbytes()}


def index_memory(folder: Path) -> dict[str, float]:
    """The resident memory a process adds by mapping the index and reading every label,
    offset and size (the arrays a reader touches), and by reading every name too."""
    code = f"""
import json, psutil
from automlperf.dataset.index import FileIndex
me = psutil.Process()
base = me.memory_full_info().uss
index = FileIndex.load({str(folder)!r})
int(index.labels.sum()); int(index.at.sum()); int(index.sizes.sum())
reading = me.memory_full_info().uss - base
int(index.blob.sum()); int(index.offsets.sum())
print(json.dumps({{"reading_mib": reading / 2**20, "all_mib": (me.memory_full_info().uss - base) / 2**20}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def loader_pass(root: Path, split: str, workers: int, epoch: int = 0) -> dict[str, float]:
    """One pass of ``split``, timed from its first batch (the workers started): the images
    after it over the seconds after it."""
    import torch

    from automlperf.train.data import ImageFolderDataset

    ds = ImageFolderDataset(root, SIZE, workers)
    ds.val_cache = False
    try:
        images, began = 0, 0.0
        for x, _ in ds.batches(split, 0, 1, BATCH, epoch, 0, torch.device("cpu")):
            if not began:
                began = time.perf_counter()
                continue
            images += len(x)
        seconds = time.perf_counter() - began
        stats = ds._loader.stats
        cpu = sum(w.cpu_seconds for w in stats.workers) / max(1, sum(w.images for w in stats.workers))
    finally:
        ds.release()
    return {"images": images, "images_per_s": images / seconds,
            "per_worker": images / seconds / workers, "cpu_ms_per_image": 1e3 * cpu}


def strace_child(root: str, epochs: int) -> None:
    """Run ``epochs`` training and validation passes with 2 workers (under strace)."""
    import torch

    from automlperf.train.data import ImageFolderDataset

    ds = ImageFolderDataset(Path(root), SIZE, 2)
    ds.val_cache = False
    for epoch in range(epochs):
        for split in ("train", "val"):
            for _ in ds.batches(split, 0, 1, BATCH, epoch, 0, torch.device("cpu")):
                pass
    ds.release()


def syscalls(root: Path, epochs: int, work: Path) -> dict[str, int]:
    out = work / f"strace-{root.name}-{epochs}.txt"
    subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", f"trace={CALLS}",
                    sys.executable, str(Path(__file__).resolve()), "--strace-child", str(root),
                    str(epochs)], check=True, capture_output=True)
    counts = {}
    for line in out.read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def per_epoch(root: Path, work: Path) -> dict[str, float]:
    one, three = syscalls(root, 1, work), syscalls(root, 3, work)
    calls = {k: (three.get(k, 0) - one.get(k, 0)) / 2 for k in set(one) | set(three)}
    opens = calls.get("open", 0) + calls.get("openat", 0)
    stats = sum(calls.get(k, 0) for k in ("stat", "lstat", "fstat", "newfstatat", "statx"))
    return {"opens": opens, "stats": stats, **{k: v for k, v in sorted(calls.items()) if v}}


def loader_figures(args: argparse.Namespace, work: Path) -> None:
    # The loader's figures on a smaller set of the same images: each pass is minutes of
    # decoding on 2 cores at 224 px.
    small, small_archives = work / "small", work / "small-archives"
    write_textured_folder(small, 10, args.loader_train, args.loader_val, size=(500, 375))
    write_archives(small, small_archives)
    for workers in (1, 2):
        for split in ("train", "val"):
            rates: dict[str, list[float]] = {"archive": [], "folder": []}
            cpu: dict[str, list[float]] = {"archive": [], "folder": []}
            for r in range(args.rounds + 1):
                for name, root in (("archive", small_archives), ("folder", small)):
                    got = loader_pass(root, split, workers)
                    if r:  # the first round warms the page cache
                        rates[name].append(got["per_worker"])
                        cpu[name].append(got["cpu_ms_per_image"])
            a, f = (statistics.median(rates[k]) for k in ("archive", "folder"))
            ca, cf = (statistics.median(cpu[k]) for k in ("archive", "folder"))
            print(f"loader {split}, {workers} worker(s): archive {a:.1f} img/s per worker, "
                  f"folder {f:.1f}; archive/folder {a / f:.3f}; a worker's CPU per image "
                  f"{ca:.2f} ms against {cf:.2f} ({ca / cf:.3f}) (medians of {args.rounds}; "
                  f"archive {[round(x, 1) for x in rates['archive']]}, folder "
                  f"{[round(x, 1) for x in rates['folder']]})", flush=True)
    count = len(list(small.rglob("*.JPEG")))
    for name, root in (("archive", small_archives), ("folder", small)):
        calls = per_epoch(root, work)
        print(f"system calls per epoch ({name}, {count:,} images, 2 workers): "
              f"{calls['opens']:.0f} opens, {calls['stats']:.0f} stat calls; "
              + ", ".join(f"{k} {v:.0f}" for k, v in calls.items() if k not in ("opens", "stats")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--train", type=int, default=70)
    parser.add_argument("--val", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loader-train", type=int, default=40, help="training images per class "
                        "of the loader's set (10 classes)")
    parser.add_argument("--loader-val", type=int, default=10)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--only-loader", action="store_true", help="the loader's figures alone")
    parser.add_argument("--strace-child", nargs=2, metavar=("ROOT", "EPOCHS"))
    args = parser.parse_args()
    if args.strace_child:
        strace_child(args.strace_child[0], int(args.strace_child[1]))
        return
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="archives-"))
    try:
        folder, archives = work / "folder", work / "archives"
        if args.only_loader:
            loader_figures(args, work)
            return
        began = time.perf_counter()
        write_textured_folder(folder, args.classes, args.train, args.val, size=(500, 375))
        write_archives(folder, archives)
        files = sorted(folder.rglob("*.JPEG"))
        mean_kb = statistics.mean(p.stat().st_size for p in files) / 1e3
        print(f"data: {len(files):,} JPEGs of 500x375, {mean_kb:.0f} KB on average (ImageNet: "
              f"about 110 KB), written with their archives in {time.perf_counter() - began:.0f} s")
        passes = {kind: [the_pass(archives, kind == "cold") for _ in range(args.rounds)]
                  for kind in ("warm", "cold")}
        md5 = md5_alone(archives)
        for kind, runs in passes.items():
            wall = statistics.median(r["wall_s_per_gb"] for r in runs)
            cpu = statistics.median(r["cpu_s_per_gb"] for r in runs)
            print(f"pass ({kind}): {runs[0]['gb']:.2f} GB, {runs[0]['images']:,} images: "
                  f"{wall:.2f} s/GB wall, {cpu:.2f} CPU-s/GB (median of {len(runs)}); 154.6 GB: "
                  f"{wall * REAL_BYTES / 1e9 / 60:.1f} min at this wall rate, "
                  f"{cpu * REAL_BYTES / 1e9 / 60:.1f} min of CPU")
        print(f"MD5 alone: {md5:.2f} CPU-s/GB ({1 / md5:.2f} GB per CPU-s); 154.6 GB: "
              f"{md5 * REAL_BYTES / 1e9 / 60:.1f} min of one core")
        shape = imagenet_index(work / "index")
        memory = index_memory(work / "index")
        print(f"index of {shape['rows']:,} rows: arrays "
              + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in shape["array_bytes"].items())
              + f"; what readers touch {shape['reading'] / 2**20:.1f} MiB, names "
              f"{shape['names'] / 2**20:.1f} MiB; resident once read: {memory['reading_mib']:.1f} "
              f"MiB (labels, offsets, sizes), {memory['all_mib']:.1f} MiB with the names")
        loader_figures(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
