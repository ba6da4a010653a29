"""How far the CPU path's reduced-scale JPEG decoding (Pillow's ``draft``) moves pixels from the
preprocessing reference, which decodes every file at full resolution
(train/data/transform.py), and what it saves: on generated photos of ImageNet's typical size
and of 2,000 px and more (textured, smooth, greyscale, progressive), with the training boxes
(several draws a file) and the validation box.

Run: python bench/bench_draft_conformance.py [--out FILE] [--draws 6] [--scale 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from automlperf.train.data.generate import photo
from automlperf.train.data.transform import decode_box, train_params, val_params

# (kind, width, height, files, noise sigma, mode, progressive)
KINDS = (("500x375 textured", 500, 375, 16, 22, "RGB", False),
         ("2048x1536 textured", 2048, 1536, 6, 22, "RGB", False),
         ("3000x2250 textured", 3000, 2250, 3, 22, "RGB", False),
         ("2048x1536 smooth", 2048, 1536, 6, 0, "RGB", False),
         ("2048x1536 greyscale", 2048, 1536, 4, 22, "L", False),
         ("2048x1536 progressive", 2048, 1536, 4, 22, "RGB", True))
QUALITY = 92


def write_photos(root: Path, kind: str, width: int, height: int, files: int, sigma: float,
                 mode: str, progressive: bool) -> list[Path]:
    """``files`` JPEGs cut from the sample photo at ``width`` x ``height``, with noise of
    ``sigma`` levels (the detail a photo's JPEG holds)."""
    src, rng = photo(), np.random.default_rng(files * width)
    out = []
    for i in range(files):
        top = int(rng.integers(0, src.height // 3))
        left = int(rng.integers(0, src.width // 3))
        img = src.crop((left, top, src.width - left // 2, src.height)).resize((width, height))
        pixels = np.asarray(img).astype(np.int16)
        if sigma:
            pixels = pixels + rng.normal(0, sigma, pixels.shape).astype(np.int16)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert(mode)
        path = root / f"{kind.replace(' ', '-')}-{i}.jpg"
        image.save(path, quality=QUALITY, progressive=progressive)
        out.append(path)
    return out


def boxes(width: int, height: int, size: int, draws: int, row: int
          ) -> list[tuple[str, tuple[float, float, float, float], bool]]:
    got: list[tuple[str, tuple[float, float, float, float], bool]] = []
    for epoch in range(draws):
        box, flip = train_params(0, epoch, row, width, height)
        got.append(("train", box, flip))
    got.append(("val", val_params(width, height, size), False))
    return got


def decode(path: Path, box: tuple[float, float, float, float], flip: bool, size: int,
           reduced: bool) -> tuple[np.ndarray, float, bool]:
    """The image, the seconds it took, and whether the decoder reduced the file's scale."""
    started = time.perf_counter()
    with Image.open(path) as file:
        width = file.width
        pixels = decode_box(file, box, flip, size, reduced=reduced)
        scaled = file.width != width
    return pixels, time.perf_counter() - started, scaled


def measure(paths: list[Path], size: int, draws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for split in ("train", "val"):
        diffs, times = [], {True: 0.0, False: 0.0}
        reduced_images = images = 0
        for row, path in enumerate(paths):
            with Image.open(path) as file:
                width, height = file.size
            for which, box, flip in boxes(width, height, size, draws, row):
                if which != split:
                    continue
                want, t_ref, _ = decode(path, box, flip, size, reduced=False)
                got, t_draft, scaled = decode(path, box, flip, size, reduced=True)
                times[False] += t_ref
                times[True] += t_draft
                images += 1
                reduced_images += scaled
                diffs.append(np.abs(got.astype(np.int16) - want.astype(np.int16)).reshape(-1))
        d = np.concatenate(diffs)
        out[split] = {
            "images": images, "decoded_at_reduced_scale": reduced_images,
            "mean_abs": round(float(d.mean()), 4),
            "p99_abs": float(np.percentile(d, 99)), "p99_9_abs": float(np.percentile(d, 99.9)),
            "max_abs": int(d.max()), "share_differing": round(float((d > 0).mean()), 4),
            "ms_per_image_reference": round(1000 * times[False] / images, 2),
            "ms_per_image_reduced": round(1000 * times[True] / images, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--draws", type=int, default=6, help="training boxes drawn per file")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply each kind's files")
    args = parser.parse_args()
    results: dict[str, Any] = {"size": args.size, "quality": QUALITY, "draws": args.draws}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, width, height, files, sigma, mode, progressive in KINDS:
            paths = write_photos(Path(tmp), kind, width, height,
                                 max(1, round(files * args.scale)), sigma, mode, progressive)
            kb = sum(p.stat().st_size for p in paths) / len(paths) / 1024
            results[kind] = {"files": len(paths), "kb_per_file": round(kb, 1),
                             **measure(paths, args.size, args.draws)}
            print(kind, json.dumps(results[kind]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
