"""The GPU decoding path's host stage: worker processes that read each file's bytes straight
into a ring of batch slots in shared memory, with the few numbers the device stage needs
beside them, so that the rank runs no Python per image.

The ring is the CPU path's (train/data/ring.py: slots made before the workers are forked,
one task queue, ``Done`` answers, cancelling, a dead worker noticed), with other contents.
Per slot and place (an image of the batch, in the step plan's order):

* the file's bytes in the slot's byte area. Each chunk of places (one task) owns the part of
  the area its places own, :data:`FILE_BYTES` per place (at least an image's pixels), and
  fills it from its start: a large file may use what the chunk's small ones left. A file is
  kept only if every place after it in the chunk still has room for an image's pixels;
* where it is (offset, length), its size, its box and flip, and its route: ``GPU`` (decoded
  on the device), ``CPU`` (decoded here by the CPU reference, its pixels, HWC uint8, written
  where its bytes would be: files a GPU decoder would refuse by their header, files too large
  for their chunk's room, boxes downscaled so much that an output pixel reads more than
  :data:`TAPS` source pixels) or ``NONE`` (unreadable: counted, label ``UNREADABLE``).

The resampling weights are computed from the boxes on the device (train/data/resample.py).

Nothing here imports torch: the rank page-locks the ring after the fork (gpudecode.py).
"""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np

from automlperf.train.data import jpeghead
from automlperf.dataset.reader import FolderReader, Opened, Reader
from automlperf.train.data.ring import UNREADABLE, Done, Task, shared_bytes
from automlperf.train.data.transform import (DECODE_ERRORS, Box, decode_box, train_params,
                                             val_params)

# Larger images go to the CPU reference: a decoded 64-megapixel image is 192 MB on the device.
MAX_PIXELS = 64 * 2**20
# Bytes a place owns in its slot: ImageNet's training files average about 110 KB, and a
# chunk's places share their room, so only rare large files are decoded on the host.
FILE_BYTES = 160 * 2**10
# Source pixels an output pixel reads at most, per axis: a box downscaled up to 15.5 times
# (2 x scale + 1 taps; a 3,500-pixel box at 224); the device sums a step's weights in that
# many operations, so rarer, steeper boxes go to the CPU reference.
TAPS = 32
GPU, CPU, NONE = 0, 1, 2  # routes


class GpuRing:
    """``slots`` batch slots of ``capacity`` places for ``size`` px images (see the module's
    description); in shared memory when ``shared``. ``rows`` and ``labels`` are laid out as
    the CPU path's :class:`~automlperf.train.data.ring.Ring` lays them out."""

    rows: np.ndarray
    labels: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    width: np.ndarray
    height: np.ndarray
    box: np.ndarray
    flip: np.ndarray
    route: np.ndarray

    def __init__(self, slots: int, capacity: int, size: int, shared: bool) -> None:
        self.slots, self.capacity, self.size = slots, capacity, size
        self.image_bytes = size * size * 3
        self.place_bytes = max(FILE_BYTES, self.image_bytes)
        fields: list[tuple[str, Any, tuple[int, ...]]] = [
            ("rows", np.int64, ()), ("labels", np.int64, ()), ("offset", np.int64, ()),
            ("length", np.int64, ()), ("width", np.int64, ()), ("height", np.int64, ()),
            ("box", np.float64, (4,)),
            ("flip", np.uint8, ()), ("route", np.uint8, ())]
        layout, at = [], 0
        for name, dtype, shape in fields:
            nbytes = slots * capacity * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            layout.append((name, dtype, shape, at))
            at += -(-nbytes // 64) * 64  # aligned for the device's copies
        self.area_bytes = capacity * self.place_bytes
        self.nbytes = at + slots * self.area_bytes
        self.buffer: Any = shared_bytes(self.nbytes) if shared else bytearray(self.nbytes)
        for name, dtype, shape, offset in layout:
            setattr(self, name, np.ndarray((slots, capacity, *shape), dtype, self.buffer, offset))
        self.files = np.ndarray((slots, self.area_bytes), np.uint8, self.buffer, at)
        self.files_offset = at

    @staticmethod
    def bytes_per_place(size: int) -> int:
        """Shared bytes a place holds, for the loader's memory plan."""
        return max(FILE_BYTES, size * size * 3) + 128

    def close(self) -> None:
        for name in ("rows", "labels", "offset", "length", "width", "height", "box", "flip",
                     "route", "files"):
            delattr(self, name)  # views first: an mmap with exported buffers cannot be closed
        if not isinstance(self.buffer, bytearray):
            self.buffer.close()


def _opened(reader: Reader, row: int) -> Opened | str:
    """The image of ``row`` ready to be read (its reading asked for ahead: the chunk's reads
    then overlap the storage's latency), or why it cannot be opened."""
    try:
        return reader.open(row)
    except OSError as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def stage_chunk(ring: GpuRing, reader: Reader, seed: int, task: Task, worker: int) -> Done:
    """The host stage of the task's places (in a worker, or in the rank without workers),
    each image's bytes read through ``reader`` straight into the slot's byte area."""
    ticket, slot, start, stop, train, epoch = task
    began, cpu = time.perf_counter(), time.process_time()
    size, image_bytes = ring.size, ring.image_bytes
    area = memoryview(ring.files[slot])
    at, end = start * ring.place_bytes, stop * ring.place_bytes
    bad, example = 0, ""
    rows = [int(row) for row in ring.rows[slot, start:stop]]
    opened = [_opened(reader, row) for row in rows]  # all first: the reads find them under way
    for pos, row, image in zip(range(start, stop), rows, opened):
        room = end - at - (stop - pos - 1) * image_bytes  # the later places' pixels kept free
        error, data, in_area = "", None, False
        if isinstance(image, str):
            error = image
        else:
            try:
                n = image.size
                in_area = n <= room
                if in_area:
                    data = area[at:at + image.readinto(area[at:at + n])]
                else:
                    data = memoryview(image.read() if n else b"")
            except OSError as exc:
                error = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            finally:
                image.close()
        if data is not None:
            error = _place(ring, slot, pos, row, data, at, in_area, train, seed, epoch, size)
        if error:
            ring.route[slot, pos] = NONE
            ring.labels[slot, pos] = UNREADABLE
            bad += 1
            example = f"{reader.name(row)}: {error}"
            continue
        ring.labels[slot, pos] = int(reader.index.labels[row])
        ring.offset[slot, pos] = at
        at += int(ring.length[slot, pos])
    return Done(ticket, start, worker, time.perf_counter() - began, time.process_time() - cpu,
                stop - start, bad, example)


def _params(train: bool, seed: int, epoch: int, row: int, width: int, height: int,
            size: int) -> tuple[Box, bool]:
    if train:
        return train_params(seed, epoch, row, width, height)
    return val_params(width, height, size), False


def _place(ring: GpuRing, slot: int, pos: int, row: int, data: memoryview, at: int,
           in_area: bool, train: bool, seed: int, epoch: int, size: int) -> str:
    """Route one file whose bytes are ``data`` (at ``at`` in its slot's area if ``in_area``)
    and record what the device stage needs; decode it here if it goes to the CPU. Returns why
    it cannot be read, or ""."""
    head = jpeghead.parse(data)
    if head is not None and in_area and not head.gpu_refusal(MAX_PIXELS):
        width, height = head.width, head.height
        box, flip = _params(train, seed, epoch, row, width, height, size)
        # At most 2 x scale + 1 taps per output pixel (train/data/resample.py's bands).
        scale = max(1.0, (box[2] - box[0]) / size, (box[3] - box[1]) / size)
        if 2 * scale + 1 <= TAPS:
            ring.route[slot, pos] = GPU
            ring.length[slot, pos] = len(data)
            ring.width[slot, pos], ring.height[slot, pos] = width, height
            ring.box[slot, pos] = box
            ring.flip[slot, pos] = flip
            return ""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as file:  # a copy: the pixels overwrite the bytes
            box, flip = _params(train, seed, epoch, row, *file.size, size)
            out = ring.files[slot, at:at + ring.image_bytes].reshape(size, size, 3)
            decode_box(file, box, flip, size, out)
    except DECODE_ERRORS as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    ring.route[slot, pos] = CPU
    ring.length[slot, pos] = ring.image_bytes
    ring.width[slot, pos], ring.height[slot, pos] = file.size
    ring.box[slot, pos] = box
    ring.flip[slot, pos] = flip
    return ""


class _Files:
    """A list of files seen as a file index: row ``first + i`` is ``paths[i]``, labels 0."""

    def __init__(self, paths: list[str], first: int) -> None:
        self.paths, self.first = paths, first
        self.labels = np.zeros(first + len(paths), np.int64)

    def path(self, row: int) -> str:
        return self.paths[row - self.first]


def stage_files(paths: list[str], size: int, train: bool, seed: int = 0, epoch: int = 0,
                first_row: int = 0) -> GpuRing:
    """A one-slot ring holding ``paths`` after the host stage, as rows ``first_row`` on (the
    rows their boxes are drawn for): the device stage of a list of files, for benchmarks."""
    ring = GpuRing(1, len(paths), size, shared=False)
    ring.rows[0] = first_row + np.arange(len(paths))
    task = (0, 0, 0, len(paths), train, epoch)
    stage_chunk(ring, FolderReader(_Files(paths, first_row)), seed, task, 0)  # type: ignore[arg-type]
    return ring
