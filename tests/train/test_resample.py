"""How a step's windows are grouped for the batched products (train/data/resample.py): the
padding that random-resized crops of ImageNet-shaped photos cost, bounded; every window in
exactly one chunk, whose size is its largest window's. What the products compute is held by
tests/train/test_gpudecode.py (each image equal to itself resampled alone, within one level
of Pillow)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from automlperf.train.data import resample as rs
from automlperf.train.data.transform import train_params

# ImageNet's photos are mostly 500 px on their long side, a quarter of them portrait; 1 % are
# camera-sized (bench/bench_resample.py draws the same mix).
SIZES = [(500, 375)] * 6 + [(375, 500)] * 2 + [(500, 333), (400, 300), (640, 480), (500, 500)]


def rrc_step(seed: int, n: int = 256, size: int = 224) -> tuple[np.ndarray, np.ndarray]:
    rng = random.Random(seed)
    shapes, boxes = [], []
    for row in range(n):
        w, h = rng.choice(SIZES)
        if rng.random() < 0.01:
            w, h = rng.choice([(1600, 1200), (1200, 1600)])
        boxes.append(train_params(seed, 0, row, w, h)[0])
        shapes.append((3, h, w))
    return np.array(shapes, np.int64), np.array(boxes, np.float64)


def padding(shapes: np.ndarray, boxes: np.ndarray, size: int = 224) -> tuple[float, list]:
    window, _ = rs.windows(boxes, shapes[:, 2], shapes[:, 1], size)
    _, table, chunks = rs.plan_windows(shapes, window, np.arange(len(shapes)))
    own = float((3 * window[:, 1] * window[:, 3]).sum())
    padded = sum((stop - start) * 3 * h * w for start, stop, h, w in chunks)
    # Every window in one chunk, in order, and each chunk as large as its largest window.
    assert [c[0] for c in chunks] == [0, *(c[1] for c in chunks[:-1])]
    assert chunks[-1][1] == len(shapes)
    for start, stop, h, w in chunks:
        assert h == table[start:stop, rs.YLEN].max() and w == table[start:stop, rs.XLEN].max()
        # Landscape and portrait windows never share a chunk.
        landscape = table[start:stop, rs.XLEN] >= table[start:stop, rs.YLEN]
        assert landscape.all() or not landscape.any()
    return padded / own, chunks


def test_random_resized_crops_of_imagenet_photos_pad_by_at_most_1_3x():
    ratios, counts = [], []
    for seed in range(6):
        ratio, chunks = padding(*rrc_step(seed))
        ratios.append(ratio)
        counts.append(len(chunks))
    # One order by area padded these steps by 1.8-2.1x in 3 chunks.
    assert max(ratios) <= rs.PAD_RATIO and np.mean(ratios) < 1.29, ratios
    assert max(counts) <= 24, counts


def test_odd_steps_still_plan_whole_chunks(monkeypatch):
    shapes, boxes = rrc_step(7, n=40)
    # One image alone, all portrait, and chunks cut by their size before their padding.
    assert padding(shapes[:1], boxes[:1])[1] == [(0, 1, *padding(shapes[:1], boxes[:1])[1][0][2:])]
    portrait = shapes[:, 1] > shapes[:, 2]
    padding(shapes[portrait], boxes[portrait])
    monkeypatch.setattr(rs, "CHUNK_FLOATS", 3 * 300 * 300)
    ratio, chunks = padding(shapes, boxes)
    assert ratio <= rs.PAD_RATIO and len(chunks) > 10
    window, _ = rs.windows(boxes[:0], shapes[:0, 2], shapes[:0, 1], 224)
    assert rs.plan_windows(shapes[:0], window, np.arange(0))[2] == []


# Under Triton's interpreter, on CPU tensors: each image of a step resampled by the
# fixed-point kernels equals Pillow's two passes (its horizontal resize of the box's columns,
# then its vertical resize of the box's rows), bit for bit, and is within one level of
# Pillow's own resize of the box (whose two passes no longer compose exactly in Pillow 13).
_FIXED = r"""
import json, sys
import numpy as np, torch
from PIL import Image
from automlperf.train.data import resample as rs, resample_fixed
from automlperf.train.data.transform import train_params, val_params
rng = np.random.default_rng(5)
images, boxes, flips, passes, whole = [], [], [], [], []
size = int(sys.argv[1])
bilinear = Image.Resampling.BILINEAR
for k in range(6):
    w, h = int(rng.integers(12, 90)), int(rng.integers(12, 90))
    base = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.Resampling.BICUBIC)
    if k % 4 == 3:
        img = img.convert("L")
    box, flip = train_params(3, 1, k, w, h) if k % 2 else (val_params(w, h, size), k % 3 == 0)
    rgb = img.convert("RGB")
    two = rgb.resize((size, h), bilinear, box=(box[0], 0, box[2], h))
    two = two.resize((size, size), bilinear, box=(0, box[1], size, box[3]))
    one = rgb.resize((size, size), bilinear, box=box)
    if flip:
        two, one = (x.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for x in (two, one))
    arr = np.array(img)
    images.append(torch.from_numpy(arr)[None] if arr.ndim == 2 else torch.from_numpy(arr).permute(2, 0, 1))
    boxes.append(box); flips.append(flip)
    passes.append(np.asarray(two).astype(int)); whole.append(np.asarray(one).astype(int))
rows = [int(r) for r in rng.permutation(len(images))]
out = torch.zeros((len(images), size, size, 3), dtype=torch.uint8)
assert resample_fixed.wanted(out.device)
rs.apply_many(images, boxes, flips, size, out, rows)
assert not resample_fixed._broken
got = [out[rows[j]].numpy().astype(int) for j in range(len(images))]
print(json.dumps({"passes": [int(np.abs(g - p).max()) for g, p in zip(got, passes)],
                  "whole": [int(np.abs(g - p).max()) for g, p in zip(got, whole)]}))
"""


@pytest.mark.slow
def test_the_fixed_point_kernels_compute_pillows_passes_bit_for_bit():
    pytest.importorskip("triton")  # with PyTorch's CUDA builds; absent from its CPU builds
    env = {**os.environ, "TRITON_INTERPRET": "1", "AUTOMLPERF_RESAMPLE": "triton"}
    done = subprocess.run([sys.executable, "-c", _FIXED, "16"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["passes"] == [0] * 6 and max(found["whole"]) <= 1, found
