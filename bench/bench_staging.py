"""What staging the data on the nodes (`automlperf stage`, `automlperf slurm --stage-to`)
costs and saves.

1. **The shared file system's load per epoch per node, with and without staging.** A real
   training process (`automlperf train`, CPU, the small seed at 32x32) trains epochs over a
   folder of textured JPEGs, once reading the shared folder and once the node's staged copy,
   under ``strace -f -e trace=openat``; the opens and bytes read under each folder are
   counted, and divided by the epochs.
2. **The staging time of a 1.33-million-file tree**: ImageNet-1k's layout and counts (1,000
   classes, 1,281,167 + 50,000 files), each file a hard link to one small JPEG, copied by
   `automlperf stage` to another folder of the same disk and checked. The files are small,
   so this is the per-file cost (a real ImageNet copy adds its 140 GB at the disks' rate).

Run: python bench/bench_staging.py [--dir DIR] [--threads 16] [--skip-large]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from automlperf import rules
from automlperf.dataset.shared import build_shared_index
from automlperf.runner import staging


def jpeg(seed: int, size: int = 96) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def small_tree(root: Path, classes: int = 10, train: int = 40, val: int = 10) -> int:
    n = 0
    for split, per in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(per):
                (folder / f"{i}.JPEG").write_bytes(jpeg(n))
                n += 1
    return n


def traced_epochs(data: Path, shared: Path, epochs: int, out: Path) -> tuple[int, int]:
    """(opens, bytes read) of files under ``shared`` by a training of ``epochs`` on ``data``."""
    trace = out / f"trace-{data.name}.txt"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,read", "-e", "signal=none",
                    "-o", str(trace), sys.executable, "-m", "automlperf.cli", "train",
                    "--dataset", "imagenet", "--data-dir", str(data), "--model", "resnet_small",
                    "--image-size", "32", "--epochs", str(epochs), "--batch-size", "32",
                    "--devices", "1"], check=True, capture_output=True, text=True)
    fds: dict[tuple[str, str], bool] = {}
    opens = read = 0
    prefix = str(shared) + "/"
    for line in trace.read_text(errors="replace").splitlines():
        pid = line.split(" ", 1)[0]
        opened = re.search(r'openat\(\w+, "([^"]+)".*\) = (\d+)$', line)
        if opened:
            mine = opened.group(1).startswith(prefix) and opened.group(1).endswith(".JPEG")
            fds[(pid, opened.group(2))] = mine
            opens += mine
            continue
        got = re.search(r"read\((\d+),.*\) = (\d+)$", line)
        if got and fds.get((pid, got.group(1))):
            read += int(got.group(2))
    return opens, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="amp-stage-", dir=args.dir))
    try:
        shared, run_dir = base / "shared" / "imagenet", base / "run"
        files = small_tree(shared)
        run_dir.mkdir()
        build_shared_index(shared, run_dir)
        record = staging.stage(run_dir, base / "local", args.threads)
        copy = Path(record["root"])
        print(f"1. {files} textured JPEGs ({record['bytes'] / 1e6:.1f} MB), {args.epochs} epochs "
              "of `automlperf train` (CPU), files opened and bytes read under the SHARED folder:")
        for name, data in (("without staging", shared), ("staged", copy)):
            opens, read = traced_epochs(data, shared, args.epochs, base)
            print(f"   {name:16s} {opens / args.epochs:8.0f} opens/epoch  "
                  f"{read / args.epochs / 1e6:8.2f} MB/epoch")
        print(f"   staging itself: {files} opens, {record['bytes'] / 1e6:.1f} MB, once, "
              f"in {record['staging_s']:.2f} s")
        if args.skip_large:
            return
        ds = rules.IMAGENET_1K
        big, big_run = base / "big" / "imagenet", base / "big-run"
        source = base / "one.JPEG"
        source.write_bytes(jpeg(0, 32))
        made = time.perf_counter()
        for split, count in (("train", ds.train_images), ("val", ds.val_images)):
            for c in ds.classes:
                (big / split / c).mkdir(parents=True)
            links: list[Path] = []
            for i in range(count):
                if i % 60_000 == 0:
                    links.append(base / f"src-{split}-{i}.JPEG")
                    shutil.copyfile(source, links[-1])
                c = ds.classes[i % 1000]
                os.link(links[-1], big / split / c / f"{c}_{i}.JPEG")
        big_run.mkdir()
        build_shared_index(big, big_run)
        print(f"2. a tree of ImageNet-1k's {ds.train_images + ds.val_images:,} files "
              f"({source.stat().st_size} B each), made in {time.perf_counter() - made:.0f} s:")
        record = staging.stage(big_run, base / "big-local", args.threads)
        print(f"   staged with {args.threads} threads in {record['staging_s']:.1f} s "
              f"(copy {record['copy_s']:.1f} s, check {record['staging_s'] - record['copy_s']:.1f} s): "
              f"{record['files'] / record['copy_s']:,.0f} files/s")
        again = staging.stage(big_run, base / "big-local", args.threads)
        print(f"   staged again on the same node (the copy kept): {again['staging_s']:.1f} s, "
              f"{again['copied_bytes']} bytes copied")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
