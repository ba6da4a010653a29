"""An ImageNet-layout folder of real JPEG photos, written on the spot: `automlperf doctor`
tries the input pipeline and a whole run on a node that has no dataset yet, and nothing is
downloaded. The images are crops of the photo matplotlib ships with its sample data, stored
at ImageNet's typical size and quality (so decoding costs what it costs on ImageNet), each
class a band of the photo (so a model has something to learn)."""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image

# ImageNet's typical stored image: 500 x 375, JPEG quality about 90.
TYPICAL_SIZE = (500, 375)


def photo() -> Image.Image:
    """The photo the folders are cut from, in RGB."""
    from matplotlib import cbook

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as image:
        return image.convert("RGB")


def write_photo_folder(root: Path, classes: int, train_per_class: int, val_per_class: int,
                       size: tuple[int, int] = TYPICAL_SIZE, seed: int = 0) -> dict[str, int]:
    """``root/{train,val}/nXXXXXXXX/*.JPEG``; returns the image count of each split."""
    src = photo()
    rng = random.Random(seed)
    band = src.width // classes
    counts = {"train": 0, "val": 0}
    for split, per in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                w = rng.randint(max(8, band // 2), max(8, band))
                h = rng.randint(src.height // 3, src.height)
                left = min(src.width - w, c * band + rng.randint(0, max(0, band - w)))
                top = rng.randint(0, src.height - h)
                img = src.crop((left, top, left + w, top + h)).resize(size)
                if rng.random() < 0.5:
                    img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                img.save(folder / f"{split}_{c}_{i}.JPEG", quality=90)
                counts[split] += 1
    return counts
