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

A step's images are resampled together with no Python per image: the host works out, for
all of them at once, only the windows of source pixels their boxes read and how they group
into chunks (:func:`windows`, :func:`plan_windows`); one table crosses to the device
without the host waiting; the weights are computed there (:func:`device_bands`: numpy's
:func:`triangle_bands`, operation for operation, in float64), the windows gathered from
the flattened images in one indexing per chunk, and both passes run as batched products
(:func:`apply_windows`). Nothing reads a value back from the device.
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


def windows(box: np.ndarray, widths: np.ndarray, heights: np.ndarray,
            size: int) -> tuple[np.ndarray, np.ndarray]:
    """For many images at once: the window of source pixels each box's resampling reads,
    (n, 4) int64 first x, width, first y, height (:func:`triangle_bands`' ``first`` and
    ``length``, from its first and last output pixels: its bands' ends only grow along a
    line), and the taps its bands need at most (2 x the downscale + 1)."""
    out = np.empty((len(box), 4), np.int64)
    taps = 1
    for axis, (a, b, extent) in enumerate(((0, 2, widths), (1, 3, heights))):
        start, end = box[:, a], box[:, b]
        scale = (end - start) / size
        filterscale = np.maximum(scale, 1.0)
        ends = np.array([0.5, size - 0.5])[None, :]
        centres = start[:, None] + ends * scale[:, None]
        top = extent.astype(np.float64)
        lo = np.clip(np.trunc(centres[:, 0] - filterscale + 0.5), 0, top).astype(np.int64)
        hi = np.clip(np.trunc(centres[:, 1] + filterscale + 0.5), 0, top).astype(np.int64)
        out[:, 2 * axis] = lo
        out[:, 2 * axis + 1] = np.maximum(hi, lo + 1) - lo
        if len(box):
            taps = max(taps, int(np.floor(2 * filterscale + 1).max()))
    return out, np.array(taps)


def device_bands(box: Any, extent: Any, flips: Any, window: Any, size: int,
                 taps: int) -> tuple[Any, Any]:
    """:func:`triangle_bands` of many images on their device, with the same operations in
    float64 (so the same weights, bit for bit), both axes, flipped where ``flips``: ``cols``
    (n, 2, size, taps) int64 and ``weights`` (n, 2, size, taps) float32, per output pixel
    the columns of the image's window it reads (:func:`windows`, as ``window``) and their
    weights, zeros past its band. The sum over taps runs in tap order, so an image's
    weights do not depend on the taps the others need."""
    import torch

    device = box.device
    f64 = torch.float64
    # Slices, not lists of columns: a list would cross to the device as a pageable copy.
    starts, ends = box[:, 0:2], box[:, 2:4]  # (n, axis)
    scale = (ends - starts) / size
    filterscale = torch.clamp(scale, min=1.0)[:, :, None]
    centres = starts[:, :, None] + (torch.arange(size, dtype=f64, device=device) + 0.5) * scale[:, :, None]
    top = extent[:, :, None]
    zero = torch.zeros((), dtype=f64, device=device)
    lo = torch.minimum(torch.maximum(torch.trunc(centres - filterscale + 0.5), zero), top)
    hi = torch.minimum(torch.maximum(torch.trunc(centres + filterscale + 0.5), zero), top)
    xs = lo[..., None] + torch.arange(taps, dtype=f64, device=device)
    band = torch.clamp(1.0 - torch.abs((xs - centres[..., None] + 0.5) / filterscale[..., None]),
                       min=0.0)
    band = band * (xs < hi[..., None])
    sums = band[..., 0]
    for t in range(1, taps):
        sums = sums + band[..., t]
    sums = sums[..., None]
    band = torch.where(sums != 0, band / torch.where(sums != 0, sums, 1.0), zero)
    band = torch.floor(band * PRECISION + 0.5) / PRECISION
    cols = lo.long()[..., None] + torch.arange(taps, device=device) - window[:, 0::2, None, None]
    inside = cols < window[:, 1::2, None, None]  # a band past the line holds zeros
    cols = torch.where(inside, cols, 0)
    weights = torch.where(inside, band, zero).float()
    # A flip reverses the output columns: the rows of the horizontal weights.
    flip = flips[:, None, None]
    cols[:, 0] = torch.where(flip, cols[:, 0].flip(1), cols[:, 0])
    weights[:, 0] = torch.where(flip, weights[:, 0].flip(1), weights[:, 0])
    return cols, weights


# Columns of a resampling table (:func:`plan_windows`): where an image starts in the flat
# buffer of a step's decoded images, its height, width and channel stride (0: greyscale,
# read thrice), its window (first x, width, first y, height) and its row of the output.
BASE, HEIGHT, WIDTH, CSTRIDE, X0, XLEN, Y0, YLEN, ROW = range(9)


def plan_windows(shapes: np.ndarray, window: np.ndarray,
                 rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, int]]]:
    """How a step's decoded images (``shapes``: (n, 3) of C, H, W, flattened one after the
    other) are resampled: an ``order`` (by window area, so that large windows share a
    chunk), the table (n, 9) in that order, and the chunks ``(start, stop, height, width)``
    of it whose windows, zero-padded to the chunk's largest, hold at most CHUNK_FLOATS."""
    channels, heights, widths = (shapes[:, k].astype(np.int64) for k in range(3))
    numel = channels * heights * widths
    base = np.concatenate([[0], np.cumsum(numel)[:-1]]).astype(np.int64)
    table = np.stack([base, heights, widths, np.where(channels == 1, 0, heights * widths),
                      window[:, 0], window[:, 1], window[:, 2], window[:, 3], rows], axis=1)
    order = np.argsort(window[:, 1] * window[:, 3], kind="stable")
    table = np.ascontiguousarray(table[order], dtype=np.int64)
    chunks, start, n = [], 0, len(table)
    while start < n:
        h = np.maximum.accumulate(table[start:, YLEN])
        w = np.maximum.accumulate(table[start:, XLEN])
        cost = (np.arange(n - start) + 1) * 3 * h * w
        over = np.flatnonzero(cost[1:] > CHUNK_FLOATS)  # the first image always goes in
        stop = start + 1 + int(over[0]) if len(over) else n
        chunks.append((start, stop, int(h[stop - start - 1]), int(w[stop - start - 1])))
        start = stop
    return order, table, chunks


def apply_windows(flat: Any, table: Any, cols: Any, weights: Any,
                  chunks: list[tuple[int, int, int, int]], size: int, out: Any) -> None:
    """Resample a step's images, flattened into ``flat`` (uint8, on the device), into their
    rows of ``out`` (NHWC uint8): ``table`` (:func:`plan_windows`), ``cols`` and ``weights``
    (:func:`device_bands`) on the device in the table's order. Per chunk, its windows are
    gathered in one indexing (positions past a window repeat its last pixel: their weights
    are zero) and resampled in two batched products; nothing waits for the device."""
    import torch

    device = flat.device
    small = flat.numel() < 2**31  # 32-bit positions halve the index's memory
    for start, stop, height, width in chunks:
        t = table[start:stop]
        n = stop - start
        ys = torch.minimum(torch.arange(height, device=device)[None, :], t[:, YLEN, None] - 1)
        xs = torch.minimum(torch.arange(width, device=device)[None, :], t[:, XLEN, None] - 1)
        channel = torch.arange(3, device=device)[None, :, None] * t[:, CSTRIDE, None, None]
        lines = (t[:, BASE, None, None] + channel
                 + (ys + t[:, Y0, None])[:, None, :] * t[:, WIDTH, None, None])  # (n, 3, h)
        across = xs + t[:, X0, None]  # (n, w)
        if small:
            lines, across = lines.int(), across.int()
        index = lines[:, :, :, None] + across[:, None, None, :]
        regions = flat.index_select(0, index.view(-1)).view(n, 3, height, width).float()
        kx = torch.zeros((n, size, width), dtype=torch.float32, device=device)
        ky = torch.zeros((n, size, height), dtype=torch.float32, device=device)
        # Each pixel's taps are distinct columns: every weight is added once, to a zero.
        kx.scatter_add_(2, cols[start:stop, 0].long(), weights[start:stop, 0])
        ky.scatter_add_(2, cols[start:stop, 1].long(), weights[start:stop, 1])
        horizontal = _round8(regions @ kx.view(n, 1, size, width).transpose(2, 3))
        pixels = _round8(ky.view(n, 1, size, height) @ horizontal)  # (n, 3, size, size)
        out.index_copy_(0, t[:, ROW], pixels.permute(0, 2, 3, 1).to(torch.uint8))


def upload(array: np.ndarray, device: Any) -> Any:
    """``array`` on ``device`` without the host waiting: through page-locked memory on CUDA."""
    import torch

    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def resample_step(flat: Any, shapes: np.ndarray, box: np.ndarray, flips: np.ndarray,
                  rows: np.ndarray, size: int, out: Any, taps: int | None = None) -> None:
    """Resample a step's decoded images, flattened one after the other into ``flat`` (their
    ``shapes``: (n, 3) of C, H, W), over their boxes, flipped where ``flips``, into rows
    ``rows`` of ``out`` (NHWC uint8, on ``flat``'s device). On the host, only numbers per
    image, for all at once: the windows and chunks; the weights are computed on the device
    (at most ``taps`` per output pixel: by default what the boxes need). One small table
    crosses to the device, without the host waiting."""
    import torch

    device = flat.device
    window, needed = windows(box, shapes[:, 2], shapes[:, 1], size)
    order, table, chunks = plan_windows(shapes, window, rows)
    numbers = np.concatenate([box, shapes[:, [2, 1]], flips[:, None]], axis=1)[order]
    # One copy to the device: the float64 numbers travel as their bits beside the table.
    both = upload(np.concatenate([table, numbers.astype(np.float64).view(np.int64)], axis=1),
                  device)
    table_d, numbers_d = both[:, :table.shape[1]], both[:, table.shape[1]:].view(torch.float64)
    cols, weights = device_bands(numbers_d[:, :4], numbers_d[:, 4:6], numbers_d[:, 6] != 0,
                                 table_d[:, X0:YLEN + 1], size,
                                 int(needed) if taps is None else taps)
    apply_windows(flat, table_d, cols, weights, chunks, size, out)


def apply_many(images: list[Any], boxes: list[Box], flips: list[bool], size: int, out: Any,
               rows: list[int]) -> None:
    """:func:`resample` for a step's images at once: image ``j`` (CHW uint8, 1 or 3
    channels) resampled over ``boxes[j]``, flipped if ``flips[j]``, into ``out[rows[j]]``
    (``out``: NHWC uint8 on the images' device), by :func:`resample_step`."""
    import torch

    if not images:
        return
    shapes = np.array([(1, *image.shape) if image.dim() == 2 else tuple(image.shape)
                       for image in images], dtype=np.int64)
    flat = torch._utils._flatten_dense_tensors(images)  # each CHW, contiguous or not
    resample_step(flat, shapes, np.array(boxes, dtype=np.float64).reshape(len(images), 4),
                  np.array(flips, dtype=bool), np.array(rows, dtype=np.int64), size, out)


def resample(image: Any, box: Box, flip: bool, size: int) -> Any:
    """The ``size`` x ``size`` HWC uint8 image of ``box`` (left, top, right, bottom in source
    pixels) in ``image`` (CHW uint8, 1 or 3 channels, on any device), flipped left to right
    if ``flip``: :func:`apply_many` for one image."""
    import torch

    out = torch.empty((1, size, size, 3), dtype=torch.uint8, device=image.device)
    apply_many([image], [box], [flip], size, out, [0])
    return out[0]
