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
with the channels folded into their rows, rounded in place (:func:`apply_windows`). Chunks
hold windows of one orientation and similar height, so padding them to a common size costs
little (:func:`plan_windows`). Nothing reads a value back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from automlperf.train.data import resample_fixed

Box = tuple[float, float, float, float]
PRECISION = float(1 << 22)


def _round8(x: Any) -> Any:
    """Pillow's rounding of a pass's result to 8 bits, in place: half up. No clipping: the
    triangle's weights are non-negative and their 22-bit fixed-point values sum to 1 within
    ``taps`` x 2^-23 (at most 4e-6 for 32 taps), so a pass over 0..255 stays within
    -0.5..255.5 before the half is added, even in float32."""
    return x.add_(0.5).floor_()


# A step's windows are resampled in chunks, each zero-padded to its largest window. Windows
# are grouped by orientation and, within one, sorted by height; a chunk closes where padding
# its windows would cost more than PAD_RATIO times their own floats. Random-resized crops of
# ImageNet's photos then pad by 1.2-1.3x in 13-18 chunks a step, where one order by area padded
# portrait and landscape windows to each other's size, about 2x (bench/bench_resample.py).
PAD_RATIO = 1.3
# A chunk's padded windows hold at most this many floats (256 MB), so one very large image
# does not pad many others to its size.
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
    # Pillow takes the box in float32 and its span in float32 before its double arithmetic.
    start, end = start.astype(np.float32), end.astype(np.float32)
    scale = (end - start).astype(np.float64) / out_size
    start = start.astype(np.float64)
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
    # Times the reciprocal, as Pillow computes it (not a division: the last bit differs).
    band = np.maximum(0.0, 1.0 - np.abs((xs - centres[:, :, None] + 0.5)
                                        * (1.0 / filterscale[:, :, None])))
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
        start, end = box[:, a].astype(np.float32), box[:, b].astype(np.float32)
        scale = (end - start).astype(np.float64) / size  # as triangle_bands
        start = start.astype(np.float64)
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
    # Pillow's box is float32, its span too (as triangle_bands).
    starts, ends = box[:, 0:2].float(), box[:, 2:4].float()  # (n, axis)
    scale = (ends - starts).double() / size
    starts = starts.double()
    filterscale = torch.clamp(scale, min=1.0)[:, :, None]
    centres = starts[:, :, None] + (torch.arange(size, dtype=f64, device=device) + 0.5) * scale[:, :, None]
    top = extent[:, :, None]
    zero = torch.zeros((), dtype=f64, device=device)
    lo = torch.minimum(torch.maximum(torch.trunc(centres - filterscale + 0.5), zero), top)
    hi = torch.minimum(torch.maximum(torch.trunc(centres + filterscale + 0.5), zero), top)
    xs = lo[..., None] + torch.arange(taps, dtype=f64, device=device)
    band = torch.clamp(1.0 - torch.abs((xs - centres[..., None] + 0.5) * (1.0 / filterscale[..., None])),
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
    other) are resampled: an ``order`` (landscape windows, then portrait ones, each by
    height then width), the table (n, 9) in that order, and the chunks ``(start, stop,
    height, width)`` of it: runs of windows that, zero-padded to the run's largest height and
    width, cost at most PAD_RATIO times their own floats and hold at most CHUNK_FLOATS."""
    channels, heights, widths = (shapes[:, k].astype(np.int64) for k in range(3))
    numel = channels * heights * widths
    base = np.cumsum(numel) - numel
    table = np.stack([base, heights, widths, np.where(channels == 1, 0, heights * widths),
                      window[:, 0], window[:, 1], window[:, 2], window[:, 3], rows], axis=1)
    portrait = window[:, 1] < window[:, 3]
    order = np.lexsort((window[:, 1], window[:, 3], portrait))
    table = np.ascontiguousarray(table[order], dtype=np.int64)
    chunks: list[tuple[int, int, int, int]] = []
    for part in (np.flatnonzero(~portrait[order]), np.flatnonzero(portrait[order])):
        start, stop_all = (int(part[0]), int(part[-1]) + 1) if len(part) else (0, 0)
        while start < stop_all:
            h = np.maximum.accumulate(table[start:stop_all, YLEN])
            w = np.maximum.accumulate(table[start:stop_all, XLEN])
            padded = (np.arange(stop_all - start) + 1) * 3 * h * w
            own = np.cumsum(3 * table[start:stop_all, YLEN] * table[start:stop_all, XLEN])
            # The first window always goes in: alone it is its own padding.
            over = np.flatnonzero((padded[1:] > PAD_RATIO * own[1:]) | (padded[1:] > CHUNK_FLOATS))
            stop = start + 1 + int(over[0]) if len(over) else stop_all
            chunks.append((start, stop, int(h[stop - start - 1]), int(w[stop - start - 1])))
            start = stop
    return order, table, chunks


def apply_windows(flat: Any, table: Any, cols: Any, weights: Any,
                  chunks: list[tuple[int, int, int, int]], size: int, out: Any) -> None:
    """Resample a step's images, flattened into ``flat`` (uint8, on the device), into their
    rows of ``out`` (NHWC uint8): ``table`` (:func:`plan_windows`), ``cols`` and ``weights``
    (:func:`device_bands`) on the device in the table's order. Per chunk, its windows are
    gathered in one indexing, laid out (n, height, channel, width) (positions past a window
    repeat its last pixel: their weights are zero), and resampled by two batched products
    with the channels folded into their rows, so neither band matrix is copied per channel:
    (n, 3h, w) x (n, w, size) horizontally, then (n, size, h) x (n, h, 3 size) vertically,
    each rounded in place. Nothing waits for the device."""
    import torch

    if not chunks:
        return
    device = flat.device
    # 32-bit positions halve the index's memory.
    itype = torch.int32 if flat.numel() < 2**31 else torch.int64
    tall = max(c[2] for c in chunks)
    wide = max(c[3] for c in chunks)
    # Every image's line starts and columns at once, sliced per chunk (views, no launch).
    ys = torch.minimum(torch.arange(tall, device=device)[None, :], table[:, YLEN, None] - 1)
    xs = torch.minimum(torch.arange(wide, device=device)[None, :], table[:, XLEN, None] - 1)
    channel = torch.arange(3, device=device)[None, None, :] * table[:, CSTRIDE, None, None]
    lines = (table[:, BASE, None, None] + channel
             + ((ys + table[:, Y0, None]) * table[:, WIDTH, None])[:, :, None]).to(itype)
    across = (xs + table[:, X0, None]).to(itype)  # (n, wide)
    for start, stop, height, width in chunks:
        n = stop - start
        index = lines[start:stop, :height, :, None] + across[start:stop, None, None, :width]
        regions = flat.index_select(0, index.view(-1)).view(n, 3 * height, width).float()
        kx = torch.zeros((n, size, width), dtype=torch.float32, device=device)
        ky = torch.zeros((n, size, height), dtype=torch.float32, device=device)
        # Each pixel's taps are distinct columns, or zeros past its window: every weight is
        # added once, to a zero.
        kx.scatter_add_(2, cols[start:stop, 0], weights[start:stop, 0])
        ky.scatter_add_(2, cols[start:stop, 1], weights[start:stop, 1])
        horizontal = _round8(torch.bmm(regions, kx.transpose(1, 2)))  # (n, h x 3, size)
        pixels = _round8(torch.bmm(ky, horizontal.view(n, height, 3 * size)))
        out.index_copy_(0, table[start:stop, ROW],
                        pixels.view(n, size, 3, size).transpose(2, 3).to(torch.uint8))


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
    if resample_fixed.wanted(device) and resample_fixed.apply_fixed(
            flat, table_d, cols, weights, size, out, table[:, YLEN]):
        return
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
