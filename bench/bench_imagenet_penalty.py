"""The ImageNet penalty: what the rank's CPU loader delivers per decoding worker on the
generated folder of smooth 500x375 JPEGs (about 29 KB, `train/data/generate.py`, the folder
`automlperf doctor` and the earlier GPU figures used) against a folder of ImageNet's weight
(500x375 with noise, about 100 KB, `bench/textured_folder.py`), training and validation
transforms at 224 px.

For each worker count, one loader per folder, both kept open; rounds alternate the folders
(A B B A) so machine noise hits both alike, and the first two rounds of each (page cache,
worker start) are not counted. A round is one whole pass of one split asked for as fast as
the rank can; its figures are the images per second the rank received, per worker, and the
rate the workers decoded at while decoding (each worker's images over its seconds inside its
chunks, summed). The penalty is the smooth folder's delivered rate over the ImageNet-weight
folder's, per split. Also: one core's Pillow decode alone (``Image.open().load()``, whole
files, no resampling) on each folder, the per-file cost the ratio comes from.

Run: python bench/bench_imagenet_penalty.py [--classes 8] [--train 48] [--val 16]
     [--rounds 6] [--batch 64] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from automlperf.train.data import ImageFolderDataset
from automlperf.train.data.generate import write_photo_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import _FdCount, _round  # noqa: E402
from textured_folder import write_textured_folder  # noqa: E402

CPU = torch.device("cpu")
SIZE = 224


def _files(root: Path, split: str) -> list[Path]:
    return sorted((root / split).rglob("*.JPEG"))


def pillow_alone(root: Path, split: str) -> dict[str, float]:
    """One core decoding whole files from memory: files per second and their mean size."""
    blobs = [p.read_bytes() for p in _files(root, split)]
    began = time.process_time()
    for blob in blobs:
        Image.open(io.BytesIO(blob)).convert("RGB").load()
    cpu = time.process_time() - began
    return {"files": len(blobs), "kb": round(statistics.mean(map(len, blobs)) / 1024, 1),
            "decodes_per_core_s": round(len(blobs) / cpu, 1)}


def penalty(folders: dict[str, Path], workers: int, batch: int, rounds: int, fds: _FdCount
            ) -> dict[str, Any]:
    """Both folders' loaders side by side at ``workers`` workers, rounds alternated; each
    round one whole pass of a split, measured as bench/bench_loader.py measures its rounds."""
    datasets = {name: ImageFolderDataset(root, SIZE, workers) for name, root in folders.items()}
    loaders = {name: ds.loader(0, 1, batch, 0, CPU) for name, ds in datasets.items()}
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    names = list(folders)
    try:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for split in ("train", "val"):
                for name in order:
                    figures = _round(loaders[name], r, True, fds, (split,))
                    if r >= 2:
                        rows.setdefault((name, split), []).append(figures)
    finally:
        for ds in datasets.values():
            ds.release()
    out: dict[str, Any] = {"workers": workers}
    for (name, split), runs in rows.items():
        delivered = statistics.median(x["delivered"] for x in runs)
        out[f"{name}_{split}"] = {
            "delivered": round(delivered, 1), "per_worker": round(delivered / workers, 1),
            "decoded": round(statistics.median(x["decoded"] for x in runs), 1),
            "rounds": len(runs), "images": len(_files(folders[name], split))}
    for split in ("train", "val"):
        out[f"penalty_{split}"] = round(out[f"smooth_{split}"]["delivered"]
                                        / out[f"imagenet_{split}"]["delivered"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--train", type=int, default=48, help="training files per class")
    ap.add_argument("--val", type=int, default=16, help="validation files per class")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64, help="images per rank and step")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3: the first two of each folder warm up and are not counted")
    torch.set_num_threads(2)  # a CPU rank on this machine: its cores
    fds = _FdCount()
    out: dict[str, Any] = {"bench": "imagenet_penalty", "size": SIZE, "batch": args.batch,
                           "load_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"smooth": Path(tmp) / "smooth", "imagenet": Path(tmp) / "imagenet"}
        write_photo_folder(folders["smooth"], args.classes, args.train, args.val)
        write_textured_folder(folders["imagenet"], args.classes, args.train, args.val,
                              (500, 375), 90)
        for name, root in folders.items():
            for split in ("train", "val"):
                out[f"pillow_{name}_{split}"] = alone = pillow_alone(root, split)
                print(f"{name} {split}: {alone['files']} files of {alone['kb']} KB, Pillow "
                      f"alone {alone['decodes_per_core_s']} decodes per core-second", flush=True)
        for workers in map(int, args.workers.split(",")):
            out[f"{workers}w"] = row = penalty(folders, workers, args.batch, args.rounds, fds)
            for split in ("train", "val"):
                s, i = row[f"smooth_{split}"], row[f"imagenet_{split}"]
                print(f"{workers} worker(s), {split}: smooth {s['delivered']:.0f} img/s "
                      f"({s['per_worker']:.0f} per worker, decoded {s['decoded']:.0f}), "
                      f"ImageNet weight {i['delivered']:.0f} ({i['per_worker']:.0f} per worker, "
                      f"decoded {i['decoded']:.0f}): penalty {row[f'penalty_{split}']:.2f}x",
                      flush=True)
    out["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
