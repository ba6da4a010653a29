"""The reference's resampling (train/data/transform.py: Pillow's BILINEAR over a box, then the
flip) for images already decoded into tensors, on any device: what the GPU decoding path
applies to nvJPEG's output so that it computes the same function as the CPU path.

Pillow resamples a box with a separable triangle filter whose support grows with the
downscale factor, horizontally first, rounding to 8 bits after each pass. Here each pass is a
matrix product with the same weights (computed as Pillow computes them, over the window of
source pixels the box touches), so any box, fractional or not, and any downscale factor
resamples alike; the flip reverses the horizontal weights' rows. Pillow's fixed-point weights
(22 bits) and its integer sums against float32 sums here move a pixel by one level at
most (a few percent of them on some boxes; tests/train/test_gpudecode.py bounds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Box = tuple[float, float, float, float]
PRECISION = float(1 << 22)


def _round8(x: Any) -> Any:
    """Pillow's rounding of a pass's result to 8 bits: half up, clipped to 0..255."""
    return (x + 0.5).floor_().clamp_(0, 255)


# A step's windows are resampled together, zero-padded to the largest window of their chunk;
# a chunk's padded windows hold at most this many floats (256 MB), so one very large image
# does not pad a whole batch to its size (sorted by window area, large ones share a chunk).
CHUNK_FLOATS = 64 * 2**20


@dataclass
class Bands:
    """:func:`triangle_weights` of many lines at once, as bands: line ``k``'s output pixel
    ``r`` reads source pixels ``lo[k, r] + t`` (``t < taps``) with weights ``band[k, r, t]``;
    its window starts at ``first[k]`` and is ``length[k]`` pixels long."""

    first: np.ndarray  # (n,)
    length: np.ndarray  # (n,)
    lo: np.ndarray  # (n, out_size)
    band: np.ndarray  # (n, out_size, taps)


def triangle_bands(start: np.ndarray, end: np.ndarray, in_size: np.ndarray, out_size: int) -> Bands:
    """The weights of Pillow's bilinear resampling of the source span ``[start[k], end[k])``
    of line ``k`` (``in_size[k]`` pixels) onto ``out_size`` pixels (``precompute_coeffs`` in
    Pillow's Resample.c), for all lines together: a step's boxes cost a few array operations,
    not a few per image. Each output pixel reads at most ``taps`` source pixels from its own
    ``lo``, so the weights are computed over that band, not the whole window."""
    scale = (end - start) / out_size
    filterscale = np.maximum(scale, 1.0)[:, None]  # the triangle's support, 1 at scale 1
    centres = start[:, None] + (np.arange(out_size) + 0.5)[None, :] * scale[:, None]
    top = in_size[:, None]
    # C's (int) truncates toward zero; both ends are clamped to the line.
    lo = np.clip(np.trunc(centres - filterscale + 0.5), 0, top).astype(np.int64)
    hi = np.clip(np.trunc(centres + filterscale + 0.5), 0, top).astype(np.int64)
    first = lo.min(axis=1)
    last = np.maximum(hi.max(axis=1), first + 1)
    taps = max(1, int((hi - lo).max(initial=0)))
    xs = lo[:, :, None] + np.arange(taps)[None, None, :]
    band = np.maximum(0.0, 1.0 - np.abs((xs - centres[:, :, None] + 0.5) / filterscale[:, :, None]))
    band *= xs < hi[:, :, None]
    sums = band.sum(axis=2, keepdims=True)
    band = np.divide(band, sums, out=np.zeros_like(band), where=sums != 0)
    # Pillow's 8-bit passes use these weights in fixed point, 22 fractional bits.
    band = np.floor(band * PRECISION + 0.5) / PRECISION
    return Bands(first, last - first, lo, band)


def apply_many(images: list[Any], boxes: list[Box], flips: list[bool], size: int, out: Any,
               rows: list[int]) -> None:
    """:func:`resample` for a step's images at once: image ``j`` (CHW uint8, 1 or 3
    channels) resampled over ``boxes[j]``, flipped if ``flips[j]``, into ``out[rows[j]]``
    (``out``: NHWC uint8 on the images' device). The weights of every image are computed
    together on the host; per chunk of windows, their bands are copied to the device, placed
    in windows zero-padded to the chunk's largest (zeros add nothing), and applied in two
    batched products."""
    if not images:
        return
    heights = np.array([image.shape[-2] for image in images], dtype=np.float64)
    widths = np.array([image.shape[-1] for image in images], dtype=np.float64)
    box = np.array(boxes, dtype=np.float64).reshape(len(images), 4)
    bx = triangle_bands(box[:, 0], box[:, 2], widths, size)
    by = triangle_bands(box[:, 1], box[:, 3], heights, size)
    flipped = np.array(flips, dtype=bool)
    # A flip reverses the output columns: the rows of the horizontal weights.
    bx.lo[flipped] = bx.lo[flipped, ::-1]
    bx.band[flipped] = bx.band[flipped, ::-1]
    order = np.argsort(bx.length * by.length, kind="stable")
    chunk: list[int] = []
    height = width = 0
    for j in map(int, order):
        h, w = max(height, int(by.length[j])), max(width, int(bx.length[j]))
        if chunk and (len(chunk) + 1) * 3 * h * w > CHUNK_FLOATS:
            _apply_chunk(images, bx, by, chunk, height, width, size, out, rows)
            chunk, h, w = [], int(by.length[j]), int(bx.length[j])
        chunk.append(j)
        height, width = h, w
    _apply_chunk(images, bx, by, chunk, height, width, size, out, rows)


def _on_device(bands: Bands, chunk: list[int], window: int, device: Any) -> Any:
    """The chunk's weights placed in windows of ``window`` pixels, built on ``device``: only
    the bands cross from the host (a few taps a pixel, not the padded windows)."""
    import torch

    first, length = bands.first[chunk], bands.length[chunk]
    band = bands.band[chunk]
    cols = bands.lo[chunk][:, :, None] + np.arange(band.shape[2])[None, None, :] - first[:, None, None]
    inside = cols < length[:, None, None]  # a band past the line holds zeros
    cols = torch.from_numpy(np.where(inside, cols, 0))
    values = torch.from_numpy(np.where(inside, band, 0.0).astype(np.float32))
    if device.type == "cuda":
        cols, values = cols.pin_memory(), values.pin_memory()
    dense = torch.zeros((len(chunk), band.shape[1], window), dtype=torch.float32, device=device)
    # Each pixel's taps are distinct columns: every weight is added once, to a zero.
    return dense.scatter_add_(2, cols.to(device, non_blocking=True),
                              values.to(device, non_blocking=True))


def _apply_chunk(images: list[Any], bx: Bands, by: Bands, chunk: list[int], height: int,
                 width: int, size: int, out: Any, rows: list[int]) -> None:
    import torch

    device = images[chunk[0]].device
    n = len(chunk)
    kx_t = _on_device(bx, chunk, width, device).view(n, 1, size, width).transpose(2, 3)
    ky_t = _on_device(by, chunk, height, device).view(n, 1, size, height)
    regions = torch.zeros((n, 3, height, width), dtype=torch.float32, device=device)
    for k, j in enumerate(chunk):
        x0, y0 = int(bx.first[j]), int(by.first[j])
        h, w = int(by.length[j]), int(bx.length[j])
        # A greyscale image fills all three channels, as Pillow's convert("RGB") gives it.
        regions[k, :, :h, :w].copy_(images[j][:, y0:y0 + h, x0:x0 + w])
    horizontal = _round8(regions @ kx_t)  # (n, 3, height, size)
    pixels = _round8(ky_t @ horizontal)  # (n, 3, size, size)
    index = torch.tensor([rows[j] for j in chunk], dtype=torch.long, device=device)
    out.index_copy_(0, index, pixels.permute(0, 2, 3, 1).to(torch.uint8))


def resample(image: Any, box: Box, flip: bool, size: int) -> Any:
    """The ``size`` x ``size`` HWC uint8 image of ``box`` (left, top, right, bottom in source
    pixels) in ``image`` (CHW uint8, 1 or 3 channels, on any device), flipped left to right
    if ``flip``: :func:`apply_many` for one image."""
    import torch

    out = torch.empty((1, size, size, 3), dtype=torch.uint8, device=image.device)
    apply_many([image], [box], [flip], size, out, [0])
    return out[0]
