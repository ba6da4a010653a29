"""The reference's resampling (train/data/transform.py: Pillow's BILINEAR over a box, then the
flip) for images already decoded into tensors, on any device: what the GPU decoding path
applies to nvJPEG's output so that it computes the same function as the CPU path.

Pillow resamples a box with a separable triangle filter whose support grows with the
downscale factor, horizontally first, rounding to 8 bits after each pass. Here each pass is a
matrix product with the same weights (computed as Pillow computes them, over the window of
source pixels the box touches), so any box, fractional or not, and any downscale factor
resamples alike; the flip reverses the horizontal weights' rows. Pillow's fixed-point weights
(22 bits) and its integer sums against float32 sums here move a pixel by one level at
most (a few percent of them on some boxes; tests/test_gpudecode.py bounds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Box = tuple[float, float, float, float]
PRECISION = float(1 << 22)


def triangle_weights(start: float, end: float, in_size: int, out_size: int) -> tuple[int, np.ndarray]:
    """(first source pixel, weights of shape ``(out_size, window)``) of Pillow's bilinear
    resampling of the source span ``[start, end)`` of a line of ``in_size`` pixels onto
    ``out_size`` pixels (``precompute_coeffs`` in Pillow's Resample.c)."""
    scale = (end - start) / out_size
    filterscale = max(scale, 1.0)
    support = filterscale  # the triangle's support is 1 at scale 1
    centres = start + (np.arange(out_size) + 0.5) * scale
    # C's (int) truncates toward zero; both ends are clamped to the line.
    lo = np.clip(np.trunc(centres - support + 0.5), 0, in_size).astype(np.int64)
    hi = np.clip(np.trunc(centres + support + 0.5), 0, in_size).astype(np.int64)
    first, last = int(lo.min()), int(max(hi.max(), lo.min() + 1))
    xs = np.arange(first, last)
    weights = np.maximum(0.0, 1.0 - np.abs((xs[None, :] - centres[:, None] + 0.5) / filterscale))
    weights *= (xs[None, :] >= lo[:, None]) & (xs[None, :] < hi[:, None])
    sums = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, sums, out=np.zeros_like(weights), where=sums != 0)
    # Pillow's 8-bit passes use these weights in fixed point, 22 fractional bits.
    return first, np.floor(weights * PRECISION + 0.5) / PRECISION


def _round8(x: Any) -> Any:
    """Pillow's rounding of a pass's result to 8 bits: half up, clipped to 0..255."""
    return (x + 0.5).floor_().clamp_(0, 255)


@dataclass
class Plan:
    """Where a box's window starts in the source (x0, y0) and the weights of both passes."""

    x0: int
    y0: int
    wx: np.ndarray  # (size, window width), rows reversed for a flip
    wy: np.ndarray  # (size, window height)


def plan(box: Box, flip: bool, size: int, width: int, height: int) -> Plan:
    """The weights that resample ``box`` of a ``width`` x ``height`` image (host side)."""
    left, top, right, bottom = box
    x0, wx = triangle_weights(left, right, width, size)
    y0, wy = triangle_weights(top, bottom, height, size)
    return Plan(x0, y0, wx[::-1] if flip else wx, wy)


def upload(plans: list[Plan], device: Any) -> list[tuple[Any, Any]]:
    """Every plan's weights on ``device`` in one copy (from pinned memory on a GPU)."""
    import torch

    sizes = [(p.wx.size, p.wy.size) for p in plans]
    flat = np.empty(sum(a + b for a, b in sizes), dtype=np.float32)
    at = 0
    for p, (a, b) in zip(plans, sizes):
        flat[at:at + a] = p.wx.ravel()
        flat[at + a:at + a + b] = p.wy.ravel()
        at += a + b
    host = torch.from_numpy(flat)
    if getattr(device, "type", "cpu") == "cuda":
        host = host.pin_memory()
    moved = host.to(device, non_blocking=True)
    out, at = [], 0
    for p, (a, b) in zip(plans, sizes):
        out.append((moved[at:at + a].view(p.wx.shape), moved[at + a:at + a + b].view(p.wy.shape)))
        at += a + b
    return out


def apply(image: Any, p: Plan, kx: Any, ky: Any, size: int, out: Any = None) -> Any:
    """Resample ``image`` (CHW uint8, 1 or 3 channels) by plan ``p`` with its weights ``kx``,
    ``ky`` on the image's device: the HWC uint8 result, written into ``out`` when given."""
    import torch

    channels = image.shape[0]
    region = image[:, p.y0:p.y0 + p.wy.shape[1], p.x0:p.x0 + p.wx.shape[1]].float()
    horizontal = _round8(region @ kx.T)  # (C, rows of the window, size)
    pixels = _round8(ky @ horizontal)  # (C, size, size)
    if channels == 1:  # greyscale as RGB, as Pillow's convert("RGB") gives it
        pixels = pixels.expand(3, size, size)
    hwc = pixels.permute(1, 2, 0)
    if out is None:
        return hwc.to(torch.uint8).contiguous()
    out.copy_(hwc)
    return out


def resample(image: Any, box: Box, flip: bool, size: int, out: Any = None) -> Any:
    """The ``size`` x ``size`` HWC uint8 image of ``box`` (left, top, right, bottom in source
    pixels) in ``image`` (CHW uint8, 1 or 3 channels, on any device), flipped left to right
    if ``flip``; written into ``out`` (HWC uint8, same device) when given."""
    _, height, width = image.shape
    p = plan(box, flip, size, width, height)
    ((kx, ky),) = upload([p], image.device)
    return apply(image, p, kx, ky, size, out)
