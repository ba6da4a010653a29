"""A folder's file mix, known before a run: every file's header read from its first bytes
(train/data/jpeghead.py :class:`~automlperf.train.data.jpeghead.FileMix`), counted by what
decides how each decode path treats it, and the cost of the files the GPU path leaves to the
CPU reference measured on a few of them.

A pass reads 4 KiB of a file (its header is there unless a large EXIF block comes first;
then up to ``HEAD_MAX``): a few seconds for 10,000 files from the page cache. Over a large
folder it reads an even sample of ``sample`` files. No torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

from automlperf.dataset.reader import Reader, reader_for
from automlperf.train.data.gpuring import FILE_BYTES, MAX_PIXELS
from automlperf.train.data.jpeghead import SOI, FileMix, JpegHeader, parse
from automlperf.train.data.index import FileIndex

HEAD_FIRST, HEAD_MAX = 4096, 256 * 1024
# Files of the CPU reference's route decoded to time it, at most.
TAIL_SAMPLE = 16


def gpu_mix(size: int, chunk: int) -> FileMix:
    """An empty tally with the GPU path's limits for ``size`` px images and ``chunk`` images
    a worker task (train/data/gpudecode.py): a place's own room, and the most a chunk's first
    place can hold (its chunk's room, less the later places' pixels)."""
    image = size * size * 3
    place = max(FILE_BYTES, image)
    return FileMix(MAX_PIXELS, place, chunk * place - (chunk - 1) * image)


def read_head_of(reader: Reader, row: int) -> tuple[JpegHeader | None, int]:
    """An image's header and size through the dataset's reader (a folder's file, or its
    place in an archive), from its first bytes (more where its header lies further)."""
    data, size = reader.head(row, HEAD_FIRST)
    head = parse(data)
    if head is None and data[:2] == SOI and size > len(data):
        head = parse(reader.head(row, HEAD_MAX)[0])
    return head, size


def folder_mix(index: FileIndex, mix: FileMix, sample: int = 20_000) -> dict[str, Any]:
    """``mix`` counts the training files of ``index`` (an even sample of ``sample`` where
    there are more), read through the dataset's reader (the archives' images too); the
    tallies, and up to TAIL_SAMPLE of the files the GPU path would leave to the CPU reference
    (a folder's paths, an archive's bytes), with how many were read and in what time."""
    rows = index.rows("train")
    step = max(1, math.ceil(len(rows) / sample)) if sample else 1
    tail: list[str | BinaryIO] = []
    unreadable = 0
    began = time.perf_counter()
    reader = reader_for(index)
    for row in rows[::step]:
        try:
            head, size = read_head_of(reader, row)
        except OSError:
            unreadable += 1
            continue
        before = mix.routes["cpu_reference"]
        mix.add(head, size)
        if mix.routes["cpu_reference"] > before and len(tail) < TAIL_SAMPLE:
            tail.append(reader.image(row))
    return {**mix.to_dict(), "train_files": len(rows), "sampled_every": step,
            "unreadable": unreadable, "seconds": time.perf_counter() - began, "tail": tail}


def tail_cost(paths: Sequence[str | BinaryIO], size: int) -> float | None:
    """Seconds a core takes to decode one of ``paths`` (or images' bytes) with the CPU
    reference, over the training transform (a centre box: the cost is the decoding's), on
    average; None for none."""
    from PIL import Image

    from automlperf.train.data.transform import DECODE_ERRORS, decode_box, val_params

    spent, done = 0.0, 0
    for path in paths:
        began = time.process_time()
        try:
            with Image.open(path) as file:
                decode_box(file, val_params(*file.size, size), False, size)
        except DECODE_ERRORS:
            continue
        spent += time.process_time() - began
        done += 1
    return spent / done if done else None
