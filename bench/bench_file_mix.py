"""The doctor's file mix (train/data/filemix.py, runner/doctor/pipeline.py ``file_mix``) on a
folder with an ImageNet-like tail: 1,000 training files of about 115 KB (500x375-ish,
textured, quality 92), 2 % progressive, 1 % greyscale, 1 % 1600x1200, 0.5 % CMYK, 0.5 %
EXIF-rotated (the mix shared/device/lend.sh generates). Prints what the doctor's input item
says, the pass's seconds and the tail's measured cost at a given rate.

    python bench/bench_file_mix.py [--folder /tmp/mixfolder] [--rate 5500]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from PIL import Image


def make(root: Path) -> None:
    rng, pick = np.random.default_rng(0), random.Random(0)
    noise = rng.normal(0, 22, (1700, 1700, 3))
    base = np.asarray(Image.new("RGB", (1600, 1600), (120, 110, 90))).astype(float)
    for i in range(1000):
        folder = root / "train" / f"n{i % 10:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        kind = ("large" if i % 100 == 7 else "grey" if i % 100 == 5 else
                "cmyk" if i % 200 == 11 else "rot" if i % 200 == 13 else
                "prog" if i % 50 == 3 else "plain")
        w, h = (1600, 1200) if kind == "large" else pick.choice([(500, 375), (375, 500), (500, 333)])
        dx, dy = pick.randint(0, 99), pick.randint(0, 99)
        px = np.clip(base[:h, :w] + noise[dy:dy + h, dx:dx + w], 0, 255).astype(np.uint8)
        im, kw = Image.fromarray(px), {"quality": 92}
        if kind == "grey":
            im = im.convert("L")
        elif kind == "cmyk":
            im = im.convert("CMYK")
        elif kind == "prog":
            kw["progressive"] = True
        elif kind == "rot":
            exif = Image.Exif()
            exif[0x0112] = 6
            kw["exif"] = exif
        im.save(folder / f"{i}.JPEG", **kw)
    for c in range(10):
        val = root / "val" / f"n{c:08d}"
        val.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64, 48)).save(val / "v.JPEG")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default="/tmp/automlperf-file-mix")
    ap.add_argument("--rate", type=float, default=5500.0, help="img/s beside training")
    args = ap.parse_args()
    from automlperf.runner.doctor.common import Shape
    from automlperf.runner.doctor.pipeline import file_mix, mix_words
    from automlperf.train.data.index import scan_image_folder

    root = Path(args.folder)
    if not (root / "val").exists():
        make(root)
    files = scan_image_folder(root)
    began = time.perf_counter()
    mix = file_mix(files, Shape("resnet50", 224, 1000, True),
                   {"per_rank": 256, "workers": 15, "training": {"images_per_s": args.rate}})
    print(f"{time.perf_counter() - began:.2f} s in all; the header pass {mix['seconds']:.2f} s")
    print(mix_words(mix))
    print(json.dumps({k: mix[k] for k in ("files", "mean_bytes", "kinds", "gpu_routes",
                                          "tail_core_s_per_file", "tail_core_s_per_epoch",
                                          "tail_cores_beside_training", "limits")}))


if __name__ == "__main__":
    main()
