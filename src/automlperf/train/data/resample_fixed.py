"""The resampling of train/data/resample.py as Pillow computes it, in its fixed-point integer
arithmetic, in two Triton kernels: 22-bit weights, 32-bit integer sums started at half a
unit, each pass rounded by a shift and clipped to 8 bits (``ImagingResampleHorizontal_8bpc``
and ``ImagingResampleVertical_8bpc`` in Pillow's Resample.c). Each output pixel reads only
its band's taps straight from the step's decoded pixels (no gathered windows, no padding, no
float copies, no dense products), and the result equals Pillow's two passes over the same box
bit for bit (its one-dimensional resizes; Pillow 13's two-dimensional resize differs from
their composition by a level here and there), where the float32 products differ from them by
one level on a few pixels.

A step costs its windows' pixels read once a tap from cache, a uint8 intermediate of
``rows x 3 x size`` per image and the output; against about 4 GB moved and 60 GFLOP of the
batched products for 256 ImageNet-shaped images (bench/bench_resample.py).

Triton comes with PyTorch's CUDA builds; its CPU builds lack it. The kernels run where
``AUTOMLPERF_RESAMPLE=triton`` asks for them and Triton imports; elsewhere, or where they
fail to build once, the batched products run. They equal Pillow's passes bit for bit under
``TRITON_INTERPRET=1`` on a CPU (tests/train/test_resample.py, where Triton is installed);
they have never run on a GPU, so they are not yet the default.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

# Table columns, as train/data/resample.py lays them out.
BASE, HEIGHT, WIDTH, CSTRIDE, X0, XLEN, Y0, YLEN, ROW = range(9)
PRECISION_BITS = 22
ROWS_PER_PROGRAM = 8
# ``AUTOMLPERF_RESAMPLE=triton`` asks for the kernels.
CHOICE_VAR = "AUTOMLPERF_RESAMPLE"

_kernels: Any = None
_broken = False


def _build() -> Any:
    """The two kernels, built on first use (importing triton costs a second or two)."""
    import triton
    import triton.language as tl

    # Kernels read no module globals (Triton allows only constexpr ones): the table's
    # columns (BASE 0, WIDTH 2, CSTRIDE 3, X0 4, Y0 6, YLEN 7, ROW 8) and the 22 bits of
    # precision are written out.
    @triton.jit
    def horizontal(flat, table, cols, k, inter, ioff, size, taps, SIZE: tl.constexpr,
                   BY: tl.constexpr):
        i = tl.program_id(0)
        ys = tl.program_id(1) * BY + tl.arange(0, BY)
        xs = tl.arange(0, SIZE)
        row = table + i * 9
        base, width, cstride = tl.load(row + 0), tl.load(row + 2), tl.load(row + 3)
        x0, y0, ylen = tl.load(row + 4), tl.load(row + 6), tl.load(row + 7)
        ymask = ys < ylen
        xmask = xs < size
        mask = ymask[:, None] & xmask[None, :]
        line = base + (y0 + ys) * width + x0  # (BY,)
        at = tl.load(ioff + i)
        for c in range(3):
            acc = tl.full((BY, SIZE), 2097152, tl.int32)  # half of 2^22
            for t in range(taps):
                band = (i * 2 * size + xs) * taps + t
                col = tl.load(cols + band, mask=xmask, other=0)
                weight = tl.load(k + band, mask=xmask, other=0)
                src = line[:, None] + c * cstride + col[None, :]
                px = tl.load(flat + src, mask=mask, other=0).to(tl.int32)
                acc += px * weight[None, :]
            value = tl.minimum(tl.maximum(acc >> 22, 0), 255).to(tl.uint8)
            tl.store(inter + at + (ys[:, None] * 3 + c) * size + xs[None, :], value, mask=mask)

    @triton.jit
    def vertical(inter, table, cols, k, ioff, out, size, taps, SIZE: tl.constexpr,
                 BY: tl.constexpr):
        i = tl.program_id(0)
        oy = tl.program_id(1) * BY + tl.arange(0, BY)
        xs = tl.arange(0, SIZE)
        ymask = oy < size
        xmask = xs < size
        mask = ymask[:, None] & xmask[None, :]
        at = tl.load(ioff + i)
        dest = tl.load(table + i * 9 + 8)
        for c in range(3):
            acc = tl.full((BY, SIZE), 2097152, tl.int32)  # half of 2^22
            for t in range(taps):
                band = ((i * 2 + 1) * size + oy) * taps + t
                src_row = tl.load(cols + band, mask=ymask, other=0)
                weight = tl.load(k + band, mask=ymask, other=0)
                src = at + (src_row[:, None] * 3 + c) * size + xs[None, :]
                px = tl.load(inter + src, mask=mask, other=0).to(tl.int32)
                acc += px * weight[:, None]
            value = tl.minimum(tl.maximum(acc >> 22, 0), 255).to(tl.uint8)
            tl.store(out + ((dest * size + oy[:, None]) * size + xs[None, :]) * 3 + c, value,
                     mask=mask)

    return horizontal, vertical


def wanted(device: Any) -> bool:
    """Whether the fixed-point kernels resample on ``device``: asked for with
    ``AUTOMLPERF_RESAMPLE=triton`` where Triton imports (on the CPU, under
    ``TRITON_INTERPRET=1``), and not failed to build. Not yet the default: they were verified
    under the interpreter only, and a GPU has to measure them first (shared/device/lend.sh)."""
    if _broken or os.environ.get(CHOICE_VAR, "") != "triton":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def apply_fixed(flat: Any, table: Any, cols: Any, weights: Any, size: int, out: Any,
                heights: Any) -> bool:
    """Resample the step (the arguments of ``resample.apply_windows``, without chunks; and
    ``heights``, the windows' heights in the table's order, on the host: they size the grid
    and the intermediate without reading the device) with the fixed-point kernels; False,
    having logged why once, where they cannot be built (the caller then runs the batched
    products)."""
    global _kernels, _broken
    import torch

    n = len(heights)
    if n == 0:
        return True
    try:
        if _kernels is None:
            _kernels = _build()
        horizontal, vertical = _kernels
        taps = int(cols.shape[-1])
        plane = table[:, YLEN] * (3 * size)
        ioff = torch.cumsum(plane, 0) - plane  # each window's rows in the intermediate
        inter = torch.empty(int(heights.sum()) * 3 * size, dtype=torch.uint8, device=flat.device)
        # The weights are multiples of 2^-22 no larger than 1: exact in float32.
        k = torch.round(weights * (1 << PRECISION_BITS)).to(torch.int32).contiguous()
        cols, table = cols.contiguous(), table.contiguous()
        block = 1 << (size - 1).bit_length()
        horizontal[(n, -(-int(heights.max()) // ROWS_PER_PROGRAM))](
            flat, table, cols, k, inter, ioff, size, taps, SIZE=block, BY=ROWS_PER_PROGRAM)
        vertical[(n, -(-size // ROWS_PER_PROGRAM))](
            inter, table, cols, k, ioff, out, size, taps, SIZE=block, BY=ROWS_PER_PROGRAM)
        return True
    except Exception:  # noqa: BLE001 - a kernel that cannot be built: the products run
        _broken = True
        log.warning("the fixed-point resampling kernels could not run; the batched products "
                    "resample instead", exc_info=True)
        return False
