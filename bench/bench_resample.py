"""The GPU path's resampling (train/data/resample.py) per 256-image step, on this machine's CPU:
the windows' padding, the batched products' floating-point work, the bytes the step's
operations move (arithmetic over the chunks the code plans), and the CPU time of the same
code on CPU tensors.

Steps are random-resized crops (the project's own boxes, train/data/transform.py) of
ImageNet-shaped photos: mostly 500 px on the long side, a quarter portrait, 1 % camera-sized
(1600x1200); the pixels are random (the arithmetic does not depend on them). Run it against
another checkout's code with ``PYTHONPATH=OTHER/src`` to compare: the traffic model follows
the code it finds (``PAD_RATIO`` marks the channels-folded products with in-place rounding).

    python bench/bench_resample.py [--steps 4] [--repeat 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np
import torch

from automlperf.train.data import resample as rs
from automlperf.train.data.transform import train_params

B, SIZE = 256, 224
SIZES = [(500, 375)] * 6 + [(375, 500)] * 2 + [(500, 333), (400, 300), (640, 480), (500, 500)]


def step(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = random.Random(seed)
    shapes, boxes, flips = [], [], []
    for row in range(B):
        w, h = rng.choice(SIZES)
        if rng.random() < 0.01:
            w, h = rng.choice([(1600, 1200), (1200, 1600)])
        box, flip = train_params(seed, 0, row, w, h)
        shapes.append((3, h, w))
        boxes.append(box)
        flips.append(flip)
    return np.array(shapes, np.int64), np.array(boxes, np.float64), np.array(flips, bool)


def traffic(chunks: list[tuple[int, int, int, int]], folded: bool) -> dict[str, float]:
    """Bytes each kind of operation reads and writes over a step's chunks, each operand
    counted once (a GEMM's re-reads of its tiles are not): E padded window elements, H the
    horizontal pass's outputs, P the output pixels, KX and KY the band matrices."""
    parts = {"index": 0.0, "gather": 0.0, "to_float": 0.0, "bands": 0.0,
             "broadcast_copies": 0.0, "products": 0.0, "rounding": 0.0, "to_uint8_and_copy": 0.0}
    for start, stop, h, w in chunks:
        n = stop - start
        e, hh, p = n * 3 * h * w, n * 3 * h * SIZE, n * 3 * SIZE * SIZE
        kx, ky = n * SIZE * w, n * SIZE * h
        parts["index"] += 4 * e  # positions written (int32)
        parts["gather"] += 4 * e + e + e  # positions and pixels read, pixels written
        parts["to_float"] += e + 4 * e
        parts["bands"] += 4 * kx + 4 * ky  # zeroed (the scatter's writes are few)
        if not folded:  # matmul broadcast each band matrix over the three channels
            parts["broadcast_copies"] += (4 + 12) * kx + (4 + 12) * ky
            parts["products"] += (4 * e + 12 * kx + 4 * hh) + (12 * ky + 4 * hh + 4 * p)
            parts["rounding"] += 24 * hh + 24 * p  # x + 0.5 (new), floor_, clamp_
        else:
            parts["products"] += (4 * e + 4 * kx + 4 * hh) + (4 * ky + 4 * hh + 4 * p)
            parts["rounding"] += 16 * hh + 16 * p  # add_, floor_ in place
        parts["to_uint8_and_copy"] += 4 * p + p + 2 * p
    parts["total"] = sum(parts.values())
    return parts


def fixed_point(window: np.ndarray, boxes: np.ndarray) -> tuple[float, float]:
    """The fixed-point kernels' (train/data/resample_fixed.py) bytes and integer operations
    for the step, by arithmetic: each window's pixels read once (a tap's re-reads hit the
    cache), the uint8 intermediate written and read, the output written; a multiply-add (2
    operations) per tap of each output of either pass (at most 2 x the downscale + 1 taps)."""
    taps_x = np.floor(2 * np.maximum((boxes[:, 2] - boxes[:, 0]) / SIZE, 1.0) + 1)
    taps_y = np.floor(2 * np.maximum((boxes[:, 3] - boxes[:, 1]) / SIZE, 1.0) + 1)
    w, h = window[:, 1].astype(float), window[:, 3].astype(float)
    moved = float((3 * w * h + 2 * 3 * h * SIZE + 3 * SIZE * SIZE).sum())
    ops = float((2 * 3 * h * SIZE * taps_x + 2 * 3 * SIZE * SIZE * taps_y).sum())
    return moved, ops


def measure(seed: int, repeat: int) -> dict[str, object]:
    shapes, boxes, flips = step(seed)
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randint(0, 256, (int(shapes.prod(axis=1).sum()),), dtype=torch.uint8,
                         generator=gen)
    rows = np.arange(B)
    window, taps = rs.windows(boxes, shapes[:, 2], shapes[:, 1], SIZE)
    t = time.perf_counter()
    _, _, chunks = rs.plan_windows(shapes, window, rows)
    plan_ms = 1e3 * (time.perf_counter() - t)
    own = float((3 * window[:, 1] * window[:, 3]).sum())
    padded = float(sum((b - a) * 3 * h * w for a, b, h, w in chunks))
    gflop = sum(2 * (b - a) * 3 * SIZE * (h * w + SIZE * h) for a, b, h, w in chunks) / 1e9
    out = torch.empty((B, SIZE, SIZE, 3), dtype=torch.uint8)
    times = []
    for k in range(repeat + 1):
        t = time.perf_counter()
        rs.resample_step(flat, shapes, boxes, flips, rows, SIZE, out)
        if k:  # the first call is a warm-up
            times.append(time.perf_counter() - t)
    moved = traffic(chunks, hasattr(rs, "PAD_RATIO"))
    fixed_bytes, fixed_ops = fixed_point(window, boxes)
    return {"seed": seed, "chunks": len(chunks), "taps": int(taps),
            "fixed_point_gbytes": fixed_bytes / 1e9, "fixed_point_gop": fixed_ops / 1e9,
            "own_mfloats": own / 1e6, "padded_mfloats": padded / 1e6,
            "padding": padded / own, "gflop": gflop, "gbytes_moved": moved["total"] / 1e9,
            "moved_gb_by_kind": {k: v / 1e9 for k, v in moved.items()},
            "plan_ms": plan_ms, "cpu_ms": [1e3 * x for x in times],
            "cpu_ms_median": 1e3 * statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    code = "channels folded, chunked by orientation and height" if hasattr(rs, "PAD_RATIO") \
        else "broadcast products, chunks by area"
    print(f"resampling of a {B}-image step to {SIZE} px, {code}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    steps = [measure(seed, args.repeat) for seed in range(args.steps)]
    for s in steps:
        print(f"  step {s['seed']}: {s['own_mfloats']:.0f} M window floats padded "
              f"{s['padding']:.2f}x in {s['chunks']} chunks, {s['gflop']:.1f} GFLOP, "
              f"{s['gbytes_moved']:.2f} GB moved, CPU {s['cpu_ms_median']:.0f} ms "
              f"({', '.join(f'{x:.0f}' for x in s['cpu_ms'])}), plan {s['plan_ms']:.2f} ms; "
              f"fixed-point kernels {s['fixed_point_gbytes']:.2f} GB, {s['fixed_point_gop']:.2f} GOP")
    mean = {k: statistics.mean(float(s[k]) for s in steps)  # type: ignore[arg-type]
            for k in ("padding", "gflop", "gbytes_moved", "cpu_ms_median", "chunks", "plan_ms",
                      "fixed_point_gbytes", "fixed_point_gop")}
    print("  mean: " + ", ".join(f"{k} {v:.2f}" for k, v in mean.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"code": code, "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "steps": steps, "mean": mean}, f, indent=1)


if __name__ == "__main__":
    main()
