"""An ImageNet-layout folder of large, textured JPEGs: the photo matplotlib ships, a band of it
per class, scaled up and overlaid with noise, so that each file holds megabytes of detail and
decoding is the costly part of the input pipeline (the folder on which `automlperf doctor
--data-dir` and `automlperf run` are compared where the loader is the bottleneck).

Run: python bench/textured_folder.py DIR [--classes 10] [--train 16] [--val 4]
     [--size 3000x2250] [--quality 90]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from PIL import Image

from automlperf.train.data.generate import photo


def write_textured_folder(root: Path, classes: int = 10, train: int = 16, val: int = 4,
                          size: tuple[int, int] = (3000, 2250), quality: int = 90) -> None:
    """``root/{train,val}/nXXXXXXXX/*.JPEG``: a band of the photo per class, scaled to
    ``size`` and overlaid with noise of 24 levels."""
    w, h = size
    src, rng = photo(), random.Random(0)
    noise = np.random.default_rng(0).normal(0, 24, (h + 64, w + 64, 3)).astype(np.int16)
    band = src.width // classes
    for split, per in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                top = rng.randint(0, src.height // 3)
                img = src.crop((c * band, top, (c + 1) * band, src.height)).resize((w, h))
                dx, dy = rng.randint(0, 63), rng.randint(0, 63)
                pixels = np.asarray(img).astype(np.int16) + noise[dy:dy + h, dx:dx + w]
                Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                    folder / f"{split}_{c}_{i}.JPEG", quality=quality)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train", type=int, default=16, help="training images per class")
    parser.add_argument("--val", type=int, default=4, help="validation images per class")
    parser.add_argument("--size", default="3000x2250")
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args()
    w, h = map(int, args.size.split("x"))
    write_textured_folder(args.root, args.classes, args.train, args.val, (w, h), args.quality)


if __name__ == "__main__":
    main()
