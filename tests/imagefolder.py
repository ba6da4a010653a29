"""ImageNet-layout folders of real JPEG photos for the tests: small patches cut from the photo
that ships with matplotlib (train/data/generate.py), with a few corrupt files among them."""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image

from automlperf.train.data.generate import photo

__all__ = ["assert_every_image_counted", "make_image_folder", "photo"]


def make_image_folder(root: Path, classes: int = 4, train_per_class: int = 12,
                      val_per_class: int = 4, corrupt: int = 2, size: int = 48,
                      seed: int = 0) -> dict[str, int]:
    """train/<class>/*.JPEG and val/<class>/*.JPEG: each class a region of the photo, each
    image a random crop of it (varied size and aspect, some flipped). ``corrupt`` files per
    split are not images (garbage bytes, a truncated JPEG). Returns the image counts."""
    rng = random.Random(seed)
    src = photo()
    w, h = src.size
    counts = {"train": 0, "val": 0, "corrupt": 0}
    for split, per in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            # Class c lives in one vertical band of the photo.
            band = (c * w // classes, (c + 1) * w // classes)
            for i in range(per):
                cw = rng.randint(max(8, (band[1] - band[0]) // 2), band[1] - band[0])
                ch = rng.randint(h // 3, h)
                left = rng.randint(band[0], band[1] - cw)
                top = rng.randint(0, h - ch)
                img = src.crop((left, top, left + cw, top + ch))
                img = img.resize((size, max(8, round(size * ch / cw))))
                if rng.random() < 0.5:
                    img = img.transpose(Image.FLIP_LEFT_RIGHT)
                img.save(folder / f"{split}_{c}_{i}.JPEG", quality=rng.randint(70, 95))
                counts[split] += 1
        for k in range(corrupt):
            bad = root / split / f"n{k % classes:08d}" / f"{split}_bad_{k}.JPEG"
            if k % 2 == 0:
                bad.write_bytes(bytes(rng.randrange(256) for _ in range(500)))
            else:  # a JPEG cut off after its header
                good = next((root / split / f"n{k % classes:08d}").glob("*_0.JPEG"))
                bad.write_bytes(good.read_bytes()[:200])
            counts["corrupt"] += 1
    return counts


def assert_every_image_counted(epochs: list[dict], devices: int, counts: dict[str, int]) -> None:
    """Two epochs of ``automlperf train --json`` on a folder of make_image_folder(corrupt=2):
    every readable image counted on every rank, the corrupt training files skipped."""
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert e["world_size"] == devices
        assert e["train_images"] == counts["train"] and e["val_images"] == counts["val"]
        # The corrupt files of each split, counted, not fatal.
        assert e["skipped_images"] == 2 and e["val_skipped"] == 2
