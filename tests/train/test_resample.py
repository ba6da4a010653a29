"""How a step's windows are grouped for the batched products (train/data/resample.py): the
padding that random-resized crops of ImageNet-shaped photos cost, bounded; every window in
exactly one chunk, whose size is its largest window's. What the products compute is held by
tests/train/test_gpudecode.py (each image equal to itself resampled alone, within one level
of Pillow)."""

from __future__ import annotations

import random

import numpy as np

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
