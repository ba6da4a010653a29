"""The one preprocessing reference of image folders: which part of a file becomes a training or
validation image, decided on the host, and the CPU (Pillow) decoder that obeys it.

Every decoder of an image folder (this module's CPU path, a GPU decoder) takes its crop box
and flip from these two functions and draws nothing of its own, so every path computes the
same function of the same file for the same (seed, epoch, row):

* :func:`train_params` ``(seed, epoch, row, width, height) -> (box, flip)``: the standard
  ImageNet training recipe's random-resized crop (a random area of 8-100 % of the image and
  a log-uniform aspect ratio of 3/4-4/3, a centre crop after ten misses), then a horizontal
  flip with probability 1/2, drawn from one ``random.Random`` seeded by
  ``mix_seed(seed, epoch, row)``. ``box`` is ``(left, top, right, bottom)`` in whole source
  pixels; the crop is resampled to ``size`` x ``size``, then flipped if ``flip``.
* :func:`val_params` ``(width, height, size=224) -> box``: the resize of the shorter side to
  ``round(size / 0.875)`` (256 for 224) followed by the centre ``size`` x ``size`` crop,
  given as the source region that crop covers: ``(left, top, right, bottom)`` in source
  pixels, as floats; no flip.

``width`` and ``height`` are the file's own (its header's) size, before any reduced-scale
decoding. The reference decodes the whole file at full resolution (libjpeg-turbo's, as
Pillow links it), then resamples the box with Pillow's BILINEAR: a separable triangle
filter whose support grows with the downscale factor (antialiased), sampled at the centres
of the output pixels inside the box, rounded to 8 bits between its two passes; then the
flip. EXIF orientation is not applied (Pillow's ``Image.open`` does not). Normalisation
follows on the device. No decoder is the reference: each implementation is bounded
against it by measurement.

:func:`decode_box` is the CPU implementation (``reduced=False``: the reference itself). It
decodes a JPEG at 1/2, 1/4 or 1/8 scale where the box still covers at least ``size``
pixels each way (``draft``), and maps the box onto the reduced image by that exact factor.
That is not rounding only: the reduced decode filters in the DCT and the triangle filter
then has a narrower support. On textured, smooth, greyscale and progressive photos of
2048x1536 and 3000x2250 at 224 pixels, the mean difference per channel was 0.5-1.4 levels,
the 99.9th percentile 7-18, the maximum 32 (bench/bench_draft_conformance.py; bounded in
tests/train/test_transform.py). Files of ImageNet's typical 500x375 are never reduced at
224 (no box covers 448 pixels each way): there it is the reference, bit for bit.

These signatures are the contract other decoders build on: keep them stable.

Nothing here imports torch.
"""

from __future__ import annotations

import math
import random
from typing import Any, BinaryIO

import numpy as np

from automlperf.seeding import mix_seed

Box = tuple[float, float, float, float]  # left, top, right, bottom in source pixels
# What a file that cannot be decoded raises while being opened, read or resampled (Pillow's
# UnidentifiedImageError is an OSError).
DECODE_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, SyntaxError)


def random_resized_crop_box(width: int, height: int, rng: random.Random,
                            scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """The crop of the standard ImageNet training recipe: a random area and aspect ratio,
    falling back to a centre crop after ten tries."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def train_params(seed: int, epoch: int, row: int, width: int,
                 height: int) -> tuple[tuple[int, int, int, int], bool]:
    """(crop box, flip) of image ``row`` in ``epoch`` of a run seeded ``seed``."""
    rng = random.Random(mix_seed(seed, epoch, row))
    box = random_resized_crop_box(width, height, rng)
    return box, rng.random() < 0.5


def val_params(width: int, height: int, size: int = 224) -> Box:
    """The source region of the validation image: the centre ``size`` crop after resizing
    the shorter side to ``round(size / 0.875)``."""
    short = round(size / 0.875)
    scale = short / min(width, height)
    resized_w = max(short, round(width * scale))
    resized_h = max(short, round(height * scale))
    left, top = (resized_w - size) // 2, (resized_h - size) // 2
    sx, sy = width / resized_w, height / resized_h
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy


def rgb(image: Any) -> Any:
    """An image as 8-bit RGB. 16-bit greyscale (PNG, TIFF) is scaled to 8 bits: Pillow's own
    conversion clips it, turning most such images white."""
    if image.mode.startswith("I"):
        from PIL import Image

        wide = np.asarray(image).astype(np.int64)
        return Image.fromarray(np.clip(wide >> 8, 0, 255).astype(np.uint8), "L").convert("RGB")
    return image.convert("RGB")


def decode_box(file: Any, box: Box, flip: bool, size: int, out: np.ndarray | None = None,
               reduced: bool = True) -> np.ndarray:
    """The ``size`` x ``size`` RGB image (HWC uint8) of ``box`` in the opened Pillow image
    ``file`` (not yet loaded), flipped if ``flip``; written into ``out`` when given. Raises
    one of :data:`DECODE_ERRORS` for a file that cannot be decoded. ``reduced=False`` is the
    reference itself: the file decoded at full resolution."""
    from PIL import Image

    width, height = file.size
    left, top, right, bottom = box
    scale = 1.0
    if reduced:
        # JPEG decodes at 1/2, 1/4 or 1/8 scale when the box stays at least `size` pixels
        # wide and high: most of the decoding cost saved. The scale is exact (a reduced
        # pixel is 2, 4 or 8 source pixels), not the reduced image's size over the file's:
        # that is rounded up to whole pixels, and shifted the box by up to 7 source pixels.
        drafted = file.draft("RGB", (math.ceil(width * size / (right - left)),
                                     math.ceil(height * size / (bottom - top))))
        if isinstance(drafted, tuple):  # (mode, the file's box at the reduced scale)
            scale = drafted[1][2] / width
    sx = sy = scale
    img = rgb(file).resize((size, size), Image.Resampling.BILINEAR,
                           box=(left * sx, top * sy, right * sx, bottom * sy))
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(img, dtype=np.uint8)
    if out is None:
        return pixels
    out[...] = pixels
    return out


def decode_file(source: str | BinaryIO, size: int, train: bool, seed: int, epoch: int, row: int,
                out: np.ndarray, reduced: bool = True) -> str | None:
    """Decode image ``row`` (the file at the path ``source``, or its bytes) into ``out`` as
    the reference says (at reduced scale where it can, unless ``reduced`` is False): None, or
    why the file cannot be read (one line)."""
    from PIL import Image

    try:
        with Image.open(source) as file:
            width, height = file.size
            box: Box
            if train:
                box, flip = train_params(seed, epoch, row, width, height)
            else:
                box, flip = val_params(width, height, size), False
            decode_box(file, box, flip, size, out, reduced)
    except DECODE_ERRORS as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return None
