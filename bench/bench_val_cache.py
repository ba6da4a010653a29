"""Validation at its true cost: a trial's epochs on an image folder with the validation shard
decoded every epoch against kept on the device after the first (train/data/valcache.py), each
epoch's validation seconds beside the forward passes' own time over the same batches already
decoded (what validation cannot go below).

Run: python bench/bench_val_cache.py [--folder DIR] [--image-size 64] [--batch 32]
     [--epochs 4] [--workers 1] [--threads 1]
The folder is made at 500x375 (bench/textured_folder.py: ImageNet's weight, about 100 KB a
file) when it does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from automlperf.graph import seeds
from automlperf.train.data import ImageFolderDataset
from automlperf.train.evaluate import evaluate
from automlperf.train.spec import TrialSpec
from automlperf.train.trainer import RankContext, _Run

HERE = Path(__file__).parent


def folder(path: Path, classes: int, train: int, val: int) -> Path:
    if not (path / "val").is_dir():
        subprocess.run([sys.executable, str(HERE / "textured_folder.py"), str(path), "--classes",
                        str(classes), "--train", str(train), "--val", str(val), "--size",
                        "500x375"], check=True)
    return path


def trial(root: Path, keep: bool, args: argparse.Namespace) -> dict[str, object]:
    ds = ImageFolderDataset(root, image_size=args.image_size, workers=args.workers)
    ds.val_cache = keep
    graph = seeds.resnet_small(num_classes=ds.num_classes, image_size=args.image_size)
    spec = TrialSpec("bench", graph.to_dict(), epochs=args.epochs, batch_size=args.batch,
                     patience=args.epochs)
    run = _Run(spec, RankContext(0, 1, torch.device("cpu"), ds), graph)
    rows = []
    try:
        for epoch in range(args.epochs):
            began = time.perf_counter()
            run.train_epoch(epoch, lambda kind, payload: None)
            trained = time.perf_counter()
            if epoch == args.epochs - 1:
                ds.expect_next(None)
            run.validate()
            validated = time.perf_counter()
            rows.append({"epoch": epoch, "train_s": trained - began,
                         "val_s": validated - trained})
        # The floor: the same forward passes over batches already decoded and normalised.
        batches = [(x.clone(), y.clone()) for x, y in ds.batches(
            "val", 0, 1, run.per_rank, 0, spec.seed, torch.device("cpu"))]
        began = time.perf_counter()
        evaluate(run.module, batches, run.autocast, run.memory_format, run.loss_fn)
        forward_s = time.perf_counter() - began
        note = ds.val_cache_note
        stats = ds.loader(0, 1, run.per_rank, spec.seed, torch.device("cpu")).stats.summary()
    finally:
        ds.release()
    return {"kept": keep, "note": note, "epochs": rows, "forward_only_val_s": forward_s,
            # Over the trial and the floor's pass: what the workers decoded and their CPU.
            "images_decoded": stats["images"], "worker_cpu_s": sum(stats["worker_cpu_s"]),
            "val_images": ds.val_size, "train_images": ds.train_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/automlperf-valcache-folder"))
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train", type=int, default=40, help="training images per class")
    parser.add_argument("--val", type=int, default=20, help="validation images per class")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="the rank's intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = folder(args.folder, args.classes, args.train, args.val)
    results = [trial(root, keep, args) for keep in (False, True)]
    print(json.dumps({"load": os.getloadavg(), "folder": str(root), "results": results},
                     indent=1))
    print("\n| validation | epoch | train s | validation s |")
    print("|---|---|---|---|")
    for r in results:
        for e in r["epochs"]:  # type: ignore[attr-defined]
            print(f"| {'kept' if r['kept'] else 'decoded'} | {e['epoch']} | {e['train_s']:.2f} "
                  f"| {e['val_s']:.2f} |")
        print(f"| {'kept' if r['kept'] else 'decoded'} | forward passes alone | | "
              f"{r['forward_only_val_s']:.2f} |")
    for r in results:
        print(f"{'kept' if r['kept'] else 'decoded'}: {r['images_decoded']} images decoded, "
              f"{r['worker_cpu_s']:.1f} worker CPU-s ({r['note']})")


if __name__ == "__main__":
    main()
