"""The GPU decoding path's loader as it was before its host stage moved to worker processes,
kept verbatim (with the resampling it called) so bench/bench_gpu_host_stage.py can run the
old and the new side by side in one run: reader threads that read each file and parse its
header under the rank's interpreter lock, and a device stage that copies each file into a
bytearray, computes the band weights with numpy, copies each image's window in a Python loop
and uploads its row index from pageable memory."""

from __future__ import annotations

import io
import queue
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.train.data import jpeghead
from automlperf.train.data.base import DataError, step_plan
from automlperf.train.data.gpudecode import (DEPTH, GIVE_UP_STEPS, MAX_PIXELS, JpegDecoder,
                                             decode_list, describe, gpu_decoder)
from automlperf.train.data.folders import ImageFolderDataset
from automlperf.train.data.resample import CHUNK_FLOATS, Bands, _round8, triangle_bands
from automlperf.train.data.transform import DECODE_ERRORS, Box, decode_box, train_params, val_params


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



@dataclass
class HostItem:
    """One image of a step after the host stage."""

    row: int
    label: int
    data: bytes | None = None  # the file, for the GPU
    box: Box = (0.0, 0.0, 0.0, 0.0)
    flip: bool = False
    pixels: np.ndarray | None = None  # decoded by the CPU reference instead (HWC uint8)
    error: str = ""  # why the file cannot be read (left out and counted)
    head: jpeghead.JpegHeader | None = None


def cpu_reference(item: HostItem, data: bytes, train: bool, seed: int, epoch: int,
                  size: int) -> HostItem:
    """Decode ``data`` with the CPU reference (Pillow), as the CPU path would."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as file:
            width, height = file.size
            box, flip = (train_params(seed, epoch, item.row, width, height) if train
                         else (val_params(width, height, size), False))
            item.pixels = decode_box(file, box, flip, size)
    except DECODE_ERRORS as exc:
        item.error = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    item.data = None
    return item


def prepare(path: str, row: int, label: int, train: bool, seed: int, epoch: int, size: int,
            max_pixels: int = MAX_PIXELS) -> HostItem:
    """The host stage for one file: read it, route it by its header, draw its box."""
    item = HostItem(row, label)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        item.error = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return item
    head = jpeghead.parse(data)
    if head is None or head.gpu_refusal(max_pixels):
        return cpu_reference(item, data, train, seed, epoch, size)
    item.data = data
    if train:
        item.box, item.flip = train_params(seed, epoch, row, head.width, head.height)
    else:
        item.box = val_params(head.width, head.height, size)
    item.head = head
    return item


@dataclass
class DecodedStep:
    images: torch.Tensor  # NHWC uint8 on the device, the step's readable images in order
    labels: torch.Tensor  # on the host
    unreadable: int
    example: str  # an unreadable file and why
    cpu_decoded: int  # images the CPU reference decoded instead of the GPU
    gpu_failed: int  # images the GPU decoder was given and failed
    gpu_given: int


def decode_step(items: list[HostItem], decoder: JpegDecoder | None, device: torch.device,
                size: int, train: bool, seed: int, epoch: int, paths: list[str]) -> DecodedStep:
    """The device stage of one step: decode the host stage's items, in their order."""
    gpu = [i for i, it in enumerate(items) if it.data is not None]
    if decoder is None:  # given up: the CPU reference takes them
        for i in gpu:
            cpu_reference(items[i], items[i].data or b"", train, seed, epoch, size)
        gpu, decoded = [], []
    else:
        files = [torch.frombuffer(bytearray(items[i].data or b""), dtype=torch.uint8) for i in gpu]
        decoded = decode_list(decoder, files, device)
    failed = 0
    by_index = dict(zip(gpu, decoded))
    for i, image in by_index.items():
        it = items[i]
        head = it.head
        if image is None or (head is not None and tuple(image.shape[-2:]) != (head.height, head.width)):
            failed += 1
            by_index[i] = None
            cpu_reference(it, it.data or b"", train, seed, epoch, size)
    keep = [i for i, it in enumerate(items) if not it.error]
    out = torch.empty((len(keep), size, size, 3), dtype=torch.uint8, device=device)
    on_gpu = [i for i in keep if by_index.get(i) is not None]
    images = [image for i in on_gpu if (image := by_index[i]) is not None]
    row = {i: n for n, i in enumerate(keep)}
    apply_many(images, [items[i].box for i in on_gpu], [items[i].flip for i in on_gpu], size,
               out, [row[i] for i in on_gpu])
    cpu = 0
    for n, i in enumerate(keep):
        if by_index.get(i) is None:
            cpu += 1
            out[n].copy_(torch.from_numpy(np.array(items[i].pixels, dtype=np.uint8)))
    labels = torch.tensor([items[i].label for i in keep], dtype=torch.long)
    if device.type == "cuda":
        labels = labels.pin_memory()  # its copy to the device is then truly asynchronous
    bad = [i for i, it in enumerate(items) if it.error]
    example = f"{paths[bad[-1]]}: {items[bad[-1]].error}" if bad else ""
    return DecodedStep(out, labels, len(bad), example, cpu, failed, len(gpu))


class _GpuLoader:
    """One rank's GPU decoding for one trial: a host thread pool and, per pass, one decode
    thread with its own stream, two steps ahead of training."""

    def __init__(self, ds: LegacyGpuImageFolderDataset, rank: int, world: int, per_rank: int,
                 seed: int, device: torch.device) -> None:
        self.ds, self.rank, self.world, self.per_rank = ds, rank, world, per_rank
        self.seed, self.device = seed, device
        self.decoder: JpegDecoder | None = ds.decoder
        self.pool = ThreadPoolExecutor(max(2, min(8, ds.workers or 2)),
                                       thread_name_prefix="automlperf-read")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.failed_steps = 0
        self.gave_up = ""

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.world, self.per_rank, self.seed, self.device)

    def _submit(self, rows: list[int], train: bool, epoch: int) -> list[Future[HostItem]]:
        index, size = self.ds.index, self.ds.image_size
        return [self.pool.submit(prepare, index.path(r), r, int(index.labels[r]), train,
                                 self.seed, epoch, size) for r in rows]

    def _decode(self, items: list[HostItem], rows: list[int], train: bool, epoch: int) -> Any:
        paths = [self.ds.index.path(r) for r in rows]
        size = self.ds.image_size
        if self.stream is None:
            return decode_step(items, self.decoder, self.device, size, train, self.seed,
                               epoch, paths), None
        # The hazard guard: nothing earlier on this stream is still running when the
        # hardware decoder writes.
        self.stream.synchronize()
        with torch.cuda.stream(self.stream):
            step = decode_step(items, self.decoder, self.device, size, train, self.seed,
                               epoch, paths)
            event = torch.cuda.Event()
            event.record(self.stream)
        return step, event

    def _produce(self, steps: list[list[int]], train: bool, epoch: int, out: queue.Queue[Any],
                 stop: threading.Event) -> None:
        try:
            ahead: deque[tuple[list[int], list[Future[HostItem]]]] = deque()
            todo = iter(steps)
            for rows in todo:
                ahead.append((rows, self._submit(rows, train, epoch)))
                if len(ahead) > DEPTH:
                    break
            while ahead and not stop.is_set():
                rows, futures = ahead.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append((nxt, self._submit(nxt, train, epoch)))
                step, event = self._decode([f.result() for f in futures], rows, train, epoch)
                self._judge(step)
                while not stop.is_set():
                    try:
                        out.put((step, event), timeout=0.1)
                        break
                    except queue.Full:
                        continue
            for _, futures in ahead:
                for f in futures:
                    f.cancel()
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread
            out.put((exc, None))
            return
        out.put((None, None))

    def _judge(self, step: DecodedStep) -> None:
        """Give the decoder up after GIVE_UP_STEPS steps in a row failed every image."""
        if step.gpu_given and step.gpu_failed == step.gpu_given:
            self.failed_steps += 1
            if self.failed_steps >= GIVE_UP_STEPS and self.decoder is not None:
                self.gave_up = f"{self.decoder.name} failed every image of {self.failed_steps} steps"
                self.decoder = None
                self.ds.path_note = self.gave_up
        elif step.gpu_given:
            self.failed_steps = 0

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step, as the CPU path's loader gives them."""
        train = split == "train"
        base = 0 if train else self.ds.index.train_size
        steps = [(rows + base).tolist() for rows in step_plan(
            len(self.ds.index.rows(split)), self.rank, self.world, self.per_rank, split, epoch,
            self.seed)]
        out: queue.Queue[Any] = queue.Queue(maxsize=DEPTH)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(steps, train, epoch, out, stop),
                                  name="automlperf-decode", daemon=True)
        thread.start()
        try:
            while True:
                step, event = out.get()
                if step is None:
                    return
                if isinstance(step, BaseException):
                    raise step
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    step.images.record_stream(current)
                self.ds.cpu_decoded += step.cpu_decoded
                yield (step.images, step.labels.to(self.device, non_blocking=True),
                       step.unreadable, step.example)
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    out.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class LegacyGpuImageFolderDataset(ImageFolderDataset):
    """The image folders decoded on the GPU with nvJPEG (see the module's description);
    ``decoder`` stands in for the library (tests give a CPU one)."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 index_dir: Path | str | None = None, decoder: JpegDecoder | None = None) -> None:
        super().__init__(root, image_size, workers, "imagenet", index_dir)
        found = decoder or gpu_decoder()
        if found is None:
            raise DataError("gpu_decode needs an nvJPEG decoder: pip install "
                            "'automlperf[nvjpeg]' (torchcodec), or set data.gpu_decode = false")
        self.decoder: JpegDecoder = found
        self.path_note = ""  # set when the decoder is given up mid-trial

    @property
    def decode_path(self) -> str:
        return describe(self.decoder) + (f" ({self.path_note}: cpu-pillow)" if self.path_note else "")

    def _new_loader(self, rank: int, world: int, per_rank: int, seed: int,
                    device: torch.device) -> Any:
        return _GpuLoader(self, rank, world, per_rank, seed, device)
