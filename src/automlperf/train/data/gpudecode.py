"""Image folders decoded on the GPU with NVIDIA nvJPEG, computing the reference's function
(train/data/transform.py): the same crop boxes and flips, drawn on the host, and the same
resampling (train/data/resample.py) applied to the decoded images on the device. Used only
when ``data.gpu_decode = true``: on one H200 the path fed a rank 2,293 img/s against the
5,639 img/s of the CPU workers (an 8,000-image folder of 500x375 photos); its device stage
alone runs at 5,040 img/s (nvJPEG alone 31,615), so the reader threads, which read each file
and parse its header in Python, are what limits it (bench/RESULTS.md).

The library is a seam (:class:`JpegDecoder`): torchcodec's ``decode_jpeg(device="cuda")``
(the ``nvjpeg`` extra, imported lazily), else torchvision's, whichever imports first; tests
put a CPU stand-in behind it. torchcodec first: it is the maintained successor of
torchvision's image decoders (deprecated since torchvision 0.29), batches a list in one
nvJPEG call with the hardware engines, and its Linux wheel (about 10 MB) bundles nvJPEG for
CUDA 13 and needs no FFmpeg for images; torchvision's is in many CUDA images already. NVIDIA
nvImageCodec (beta) and DALI's decoder are measured beside them by
bench/bench_gpu_decode.py; DALI as a whole weighs about 0.5 GB and draws its own crops
(dali.py). Per step of a pass:

* **Host stage** (a few threads): read each file, parse its header (train/data/jpeghead.py),
  draw its box and flip. Files a GPU decoder would refuse or decode as another function (not
  a JPEG, CMYK, 12-bit, lossless or arithmetic coding, an EXIF rotation, over
  ``MAX_PIXELS``) are decoded here by the CPU reference instead, one by one; files that
  cannot be read are left out and counted, as on the CPU path.
* **Device stage** (one thread per rank, its own CUDA stream): decode the step's list in one
  call, resample the images into the batch together, record an event; the training thread
  waits on that event, not on the host. Two steps are in flight.

Guards against nvJPEG's known hazards: the decode stream is synchronised before each call
(hardware decoding writes its outputs without waiting for earlier work on the stream), the
call runs outside the training thread (the decoder holds a process-wide lock and
synchronises its stream before returning), a list that fails as a whole is decoded again
image by image and what still fails goes to the CPU reference, and the resampling is two
batched matrix products over the step's windows (no limit on the downscale factor). A decoder that fails every
image of two steps in a row is given up for the rest of the trial, and the path records it.
"""

from __future__ import annotations

import io
import queue
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from automlperf.train.data import jpeghead
from automlperf.train.data.base import DataError, step_plan
from automlperf.train.data.folders import ImageFolderDataset
from automlperf.train.data.resample import apply_many
from automlperf.train.data.transform import DECODE_ERRORS, Box, decode_box, train_params, val_params

# Larger images go to the CPU path: a decoded 64-megapixel image is 192 MB on the device.
MAX_PIXELS = 64 * 2**20
DEPTH = 2  # steps decoded ahead of the one training
GIVE_UP_STEPS = 2  # steps in a row whose every GPU image failed: the decoder is not working


class JpegDecoder(Protocol):
    """Decodes a list of JPEG files (1-D uint8 CPU tensors of their bytes) into CHW uint8
    RGB images on ``device``; may fail for the whole list when one file fails."""

    name: str

    def versions(self) -> dict[str, str]: ...

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]: ...


class TorchcodecDecoder:
    """torchcodec's nvJPEG decoder (the maintained successor of torchvision's): one batched
    call per list; it synchronises its stream before decoding (the hazard above)."""

    name = "nvjpeg-torchcodec"

    def __init__(self) -> None:
        from torchcodec.decoders import decode_jpeg

        self._decode = decode_jpeg

    def versions(self) -> dict[str, str]:
        import torchcodec

        return {"torchcodec": str(getattr(torchcodec, "__version__", "?")),
                "torch": torch.__version__, "cuda": str(torch.version.cuda)}

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return list(self._decode(files, mode="RGB", device=device))


class TorchvisionDecoder:
    """torchvision's batched ``decode_jpeg(device='cuda')`` (deprecated since torchvision
    0.29 in favour of torchcodec; in many CUDA images already)."""

    name = "nvjpeg-torchvision"

    def __init__(self) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg

        self._decode, self._mode = decode_jpeg, ImageReadMode.RGB

    def versions(self) -> dict[str, str]:
        import torchvision

        return {"torchvision": torchvision.__version__, "torch": torch.__version__,
                "cuda": str(torch.version.cuda)}

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return list(self._decode(files, mode=self._mode, device=device))


DECODERS: tuple[type, ...] = (TorchcodecDecoder, TorchvisionDecoder)


def gpu_decoder() -> JpegDecoder | None:
    """The first nvJPEG decoder that imports here (torchcodec, torchvision), or None."""
    for cls in DECODERS:
        try:
            return cls()
        except Exception:  # noqa: BLE001 - absent, or built without what it needs
            continue
    return None


def describe(decoder: JpegDecoder) -> str:
    """The decode path as runs record it: the decoder and its libraries' versions."""
    return f"{decoder.name} " + " ".join(f"{k} {v}" for k, v in decoder.versions().items())


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


def decode_list(decoder: JpegDecoder, files: list[torch.Tensor],
                device: torch.device) -> list[torch.Tensor | None]:
    """Each file decoded, None where it fails: the list in one call, then, if that fails as
    a whole, image by image."""
    if not files:
        return []
    try:
        images = decoder.decode(files, device)
        if len(images) == len(files):
            return list(images)
    except Exception:  # noqa: BLE001 - one bad file fails the whole list
        pass
    out: list[torch.Tensor | None] = []
    for f in files:
        try:
            out.append(decoder.decode([f], device)[0])
        except Exception:  # noqa: BLE001 - this file goes to the CPU reference
            out.append(None)
    return out


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

    def __init__(self, ds: GpuImageFolderDataset, rank: int, world: int, per_rank: int,
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


class GpuImageFolderDataset(ImageFolderDataset):
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
