"""The ImageNet-folder input pipeline at 224x224 on this machine, and what it costs a step.

1. Images per second decoded and augmented (random-resized crop to 224, flip; uint8 CHW
   batches, normalised as the trainer receives them) by automlperf's image-folder dataset,
   beside a plain hand-written PIL + DataLoader loop doing the same work with the same
   number of workers. Passes alternate A B B A so machine noise hits both alike; the first
   pair warms the page cache. Figure: the median ratio automlperf / plain, per worker count.
2. The trainer's data-loading share of step time for ResNet-50 at 224 on those files: the
   time the training loop waits for the next batch over the epoch's time (the share every
   epoch event records).

The files are JPEGs of ImageNet's typical size (about 500x375, quality 90) cut from the
photo matplotlib ships, written once into a temporary folder.

Run: python bench/bench_imagenet_pipeline.py [--images 256] [--passes 6] [--train-images 48]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from automlperf.graph import seeds
from automlperf.train.data import ImageFolderDataset, random_resized_crop_box
from automlperf.hardware import cores_available
from automlperf.train.trainer import RankContext, TrialSpec, _Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from imagefolder import photo  # noqa: E402

CPU = torch.device("cpu")


def write_folder(root: Path, images: int, classes: int = 8) -> None:
    rng = random.Random(0)
    src = photo()
    for i in range(images):
        for split in ("train", "val"):
            folder = root / split / f"n{i % classes:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            w, h = rng.randint(250, src.width), rng.randint(250, src.height)
            left, top = rng.randint(0, src.width - w), rng.randint(0, src.height - h)
            img = src.crop((left, top, left + w, top + h)).resize((500, 375))
            img.save(folder / f"{split}_{i}.JPEG", quality=90)


class PlainFolder(torch.utils.data.Dataset):
    """The textbook loader: open, convert, crop, resize, flip, to a uint8 tensor."""

    def __init__(self, files: list[tuple[str, int]], size: int) -> None:
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.files[i]
        rng = random.Random(i)
        with Image.open(path) as f:
            img = f.convert("RGB")
        box = random_resized_crop_box(img.width, img.height, rng)
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1), label


def ours(ds: ImageFolderDataset, batch: int, epoch: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    for _, y in ds.batches("train", 0, 1, batch, epoch, 0, CPU):
        n += len(y)
    return n, time.perf_counter() - t0


def plain(files: list[tuple[str, int]], workers: int, batch: int) -> tuple[int, float]:
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1) * 255
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1) * 255
    loader = torch.utils.data.DataLoader(PlainFolder(files, 224), batch_size=batch, shuffle=True,
                                         num_workers=workers)
    t0 = time.perf_counter()
    n = 0
    for x, y in loader:
        _ = (x.float() - mean) / std
        n += len(y)
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-images", type=int, default=48, help="ResNet-50 epoch size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    out: dict[str, object] = {"bench": "imagenet_pipeline", "cores": cores_available()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_folder(root, args.images)
        for workers in (1, 2):
            ds = ImageFolderDataset(root, 224, workers)
            files = ds._items["train"]
            rates: dict[str, list[float]] = {"ours": [], "plain": []}
            for p in range(args.passes):
                order = ("ours", "plain") if p % 2 == 0 else ("plain", "ours")
                for name in order:
                    n, s = ours(ds, args.batch, p) if name == "ours" else plain(files, workers, args.batch)
                    if p >= 2:  # the first pair warms the page cache
                        rates[name].append(n / s)
            ratio = statistics.median(a / b for a, b in zip(rates["ours"], rates["plain"]))
            rows.append((workers, statistics.median(rates["ours"]), statistics.median(rates["plain"]), ratio))
            out[f"images_per_s_{workers}w"] = statistics.median(rates["ours"])
            out[f"plain_images_per_s_{workers}w"] = statistics.median(rates["plain"])
            out[f"ratio_{workers}w"] = ratio

        # ResNet-50 at 224 through the trainer on a small slice of the same files.
        sub = root / "slice"
        for split in ("train", "val"):
            for f in sorted((root / split).rglob("*.JPEG"))[: args.train_images if split == "train" else 8]:
                dst = sub / split / f.parent.name / f.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to(f)
        torch.set_num_threads(max(1, cores_available() - 1))
        ds = ImageFolderDataset(sub, 224, workers=1)
        graph = seeds.resnet50(num_classes=ds.num_classes, image_size=224)
        spec = TrialSpec("bench", graph.to_dict(), epochs=1, batch_size=16, patience=2)
        run = _Run(spec, RankContext(0, 1, CPU, ds), graph)
        _, images, steps, wait, seconds = run.train_epoch(0, lambda kind, msg: None)
        share = wait / seconds
        out.update(resnet50_images_per_s=images / seconds, resnet50_data_share=share,
                   resnet50_steps=steps)

    print(f"{'workers':>8} {'automlperf img/s':>17} {'plain img/s':>12} {'ratio':>6}")
    for w, a, b, r in rows:
        print(f"{w:>8} {a:>17.1f} {b:>12.1f} {r:>6.2f}")
    print(f"ResNet-50 at 224, batch 16, {images} images: {images / seconds:.2f} img/s, data "
          f"loading {100 * share:.1f} % of step time ({steps} steps)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
