"""Image folders decoded on the GPU with NVIDIA nvJPEG, computing the reference's function
(train/data/transform.py): the same crop boxes and flips, drawn on the host, and the same
resampling (train/data/resample.py) applied to the decoded images on the device. Used where
``data.gpu_decode = true``, or where it is unset and `automlperf doctor` measured this path
faster on the node (decodechoice.py). Before its host stage moved to worker processes, the path fed
one H200 2,293 img/s against the 5,639 img/s of the CPU workers (an 8,000-image folder of
500x375 photos), limited by reader threads and a device stage sharing the rank's interpreter
lock (bench/RESULTS.md; bench/bench_gpu_host_stage.py measures both designs on a CPU).

The library is a seam (:class:`JpegDecoder`): torchcodec's ``decode_jpeg(device="cuda")``
(the ``nvjpeg`` extra, imported lazily), else torchvision's, whichever imports first; tests
put a CPU stand-in behind it. torchcodec first: it is the maintained successor of
torchvision's image decoders (deprecated since torchvision 0.29), batches a list in one
nvJPEG call with the hardware engines, and its Linux wheel (about 10 MB) bundles nvJPEG for
CUDA 13 and needs no FFmpeg for images; torchvision's is in many CUDA images already. NVIDIA
nvImageCodec (beta) and DALI's decoder are measured beside them by
bench/bench_gpu_decode.py; DALI as a whole weighs about 0.5 GB and draws its own crops
(dali.py). Per step of a pass:

* **Host stage** (the loader's worker processes, train/data/gpuring.py, on the CPU path's
  queue and ring machinery, train/data/loader.py): read each file straight into the batch's
  slot of a ring in shared memory, page-locked on CUDA; parse its header
  (train/data/jpeghead.py); draw its box and flip (the resampling weights are computed from
  the boxes on the device). Files a GPU decoder would refuse or decode as another function (not a JPEG,
  CMYK, 12-bit, lossless or arithmetic coding, an EXIF rotation, over ``MAX_PIXELS``), files
  too large for their slot, and boxes downscaled beyond what the device's bands hold are
  decoded there by the CPU reference; files that cannot be read are left out and counted,
  as on the CPU path.
* **Device stage** (:func:`decode_slot`, in one thread per rank, two steps ahead of
  training): views of the slot's files (no copy) decoded in one call on a decode stream;
  on a second, high-priority stream, the slot's weights and a small table copied from
  page-locked memory without the host waiting, every window gathered in one indexing per
  chunk and resampled in two batched products, and the CPU reference's images uploaded in
  one copy; an event recorded that the training stream waits on, not the host. Step k+1's
  decoding overlaps step k's resampling. Python per image is limited to listing the decoded
  images (their shapes, one view each); CPU decoding in the rank happens only for files the
  decoder failed.

Guards against nvJPEG's known hazards: the decode stream is synchronised before each call
(hardware decoding writes its outputs without waiting for earlier work on the stream; the
stream holds only decoding, so this waits for nothing else), the call runs outside the
training thread (the decoder holds a process-wide lock and synchronises its stream before
returning), a list that fails as a whole is decoded again image by image and what still
fails goes to the CPU reference, and the resampling is two batched matrix products over
the step's windows (no limit on the downscale factor beyond the host stage's routing). A
decoder that fails every image of two steps in a row is given up for the rest of the trial,
and the path records it. A slot is written again only once the device has read it.
"""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from automlperf.train.data.base import DataError
from automlperf.train.data.folders import ImageFolderDataset, fit_shared_budget, plan_loader, shm_free
from automlperf.train.data.gpuring import CPU, GPU, MAX_PIXELS, NONE, GpuRing, stage_chunk
from automlperf.train.data.handoff import EventHandoff, HostHandoff, page_lock
from automlperf.train.data.loader import FolderLoader
from automlperf.train.data.resample import resample_step, upload
from automlperf.train.data.transform import DECODE_ERRORS, decode_box

__all__ = ["MAX_PIXELS", "DEPTH", "GIVE_UP_STEPS", "GpuImageFolderDataset", "JpegDecoder",
           "decode_list", "decode_slot", "describe", "gpu_decoder"]

DEPTH = 2  # steps decoded ahead of the one training
GIVE_UP_STEPS = 2  # steps in a row whose every GPU image failed: the decoder is not working
# The ring's slots: decoding a batch takes about 10 ms on the device against about 50 on
# the CPU workers, so fewer slots than the CPU path's keep the workers busy.
GPU_SLOTS = 4
# Images per worker task: the chunk's places share their bytes (a large file uses what small
# ones leave), and a task costs the rank about 50 us.
GPU_CHUNK_IMAGES = 32


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
    labels: torch.Tensor  # on the host (page-locked on CUDA)
    unreadable: int  # files the decoder and then the CPU reference failed here
    example: str  # one of them and why
    cpu_decoded: int  # images the CPU reference decoded instead of the GPU
    gpu_failed: int  # images the GPU decoder was given and failed
    gpu_given: int
    event: Any = None  # on CUDA: recorded once the step's images are complete


class Streams:
    """A rank's decode stream and its high-priority resample stream (CUDA only)."""

    def __init__(self, device: torch.device) -> None:
        self.decode = torch.cuda.Stream(device)
        self.resample = torch.cuda.Stream(device, priority=-1)

    def synchronize(self) -> None:
        self.decode.synchronize()
        self.resample.synchronize()


def _reference(data: Any, box: np.ndarray, flip: bool, size: int) -> np.ndarray | str:
    """A file the decoder failed, decoded by the CPU reference over its drawn box; or why it
    cannot be read."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data.numpy()))) as file:
            box_: Any = tuple(float(v) for v in box)
            return np.array(decode_box(file, box_, flip, size))  # writable: it becomes a tensor
    except DECODE_ERRORS as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _views(area: torch.Tensor, offset: np.ndarray, length: np.ndarray) -> list[torch.Tensor]:
    """Views of the files at ``offset`` (ascending) in ``area``, in one split: files lie back
    to back in a chunk, so only the few gaps between them make extra pieces."""
    end = offset + length
    gap = np.empty_like(offset)
    gap[0], gap[1:] = offset[0], offset[1:] - end[:-1]
    sizes = np.stack([gap, length], axis=1).ravel()
    keep = sizes != 0
    keep[1::2] = True  # an empty file is still one
    pieces = torch.split(area[:int(end[-1])], sizes[keep].tolist())
    at = np.cumsum(keep) - 1
    return [pieces[i] for i in at[1::2].tolist()]


def decode_slot(ring: GpuRing, slot: int, n: int, decoder: JpegDecoder | None,
                device: torch.device, streams: Streams | None = None,
                path_of: Callable[[int], str] = str) -> DecodedStep:
    """The device stage of the step in ``slot``'s first ``n`` places (see the module's
    description): its readable images in place order. ``decoder`` None: given up, the CPU
    reference decodes the files here. ``path_of`` names a row's file in the example."""
    size = ring.size
    route = ring.route[slot, :n]
    gpu = np.flatnonzero(route == GPU)
    files_t = torch.from_numpy(ring.files[slot])
    decoding = torch.cuda.stream(streams.decode) if streams else contextlib.nullcontext()
    resampling = torch.cuda.stream(streams.resample) if streams else contextlib.nullcontext()
    decoded: list[torch.Tensor | None] = [None] * len(gpu)
    files: list[torch.Tensor] = []
    if len(gpu):
        files = _views(files_t, ring.offset[slot, gpu], ring.length[slot, gpu])
        if decoder is not None:
            if streams:
                streams.decode.synchronize()  # the hazard guard (the module's description)
            with decoding:
                decoded = decode_list(decoder, files, device)
    if all(im is not None and im.dim() == 3 for im in decoded):
        shapes = np.array([im.shape for im in decoded], dtype=np.int64).reshape(-1, 3)  # type: ignore[union-attr]
    else:
        shapes = np.array([tuple(im.shape) if im is not None and im.dim() == 3 else (0, 0, 0)
                           for im in decoded], dtype=np.int64).reshape(-1, 3)
    ok = ((shapes[:, 1] == ring.height[slot, gpu]) & (shapes[:, 2] == ring.width[slot, gpu])
          & np.isin(shapes[:, 0], (1, 3)))
    here: dict[int, np.ndarray] = {}
    errors: dict[int, str] = {}
    for j in np.flatnonzero(~ok):  # rare while the decoder works
        place = int(gpu[j])
        got = _reference(files[j], ring.box[slot, place], bool(ring.flip[slot, place]), size)
        if isinstance(got, str):
            errors[place] = got
        else:
            here[place] = got
    readable = route != NONE
    readable[list(errors)] = False
    keep = np.flatnonzero(readable)
    out_row = np.cumsum(readable) - 1
    good = np.flatnonzero(ok)
    flat = None
    if len(good):
        with decoding:
            # One call flattens and joins them (what DDP uses for its buckets): no Python per image.
            flat = torch._utils._flatten_dense_tensors([decoded[j] for j in good])
    if streams:  # the resampling, and the slot's release, follow the decoding
        streams.resample.wait_stream(streams.decode)
        if flat is not None:
            flat.record_stream(streams.resample)
    with resampling:
        out = torch.empty((len(keep), size, size, 3), dtype=torch.uint8, device=device)
        if flat is not None:
            places = gpu[good]
            resample_step(flat, shapes[good], ring.box[slot, places], ring.flip[slot, places] != 0,
                          out_row[places], size, out)
        on_host = sorted([*np.flatnonzero(route == CPU).tolist(), *here])
        if on_host:
            pieces = [torch.from_numpy(here[p]).view(-1) if p in here else
                      files_t[int(ring.offset[slot, p]):int(ring.offset[slot, p]) + ring.image_bytes]
                      for p in on_host]
            staging = torch.empty(len(on_host) * ring.image_bytes, dtype=torch.uint8,
                                  pin_memory=device.type == "cuda")
            torch.cat(pieces, out=staging)
            pixels = staging.to(device, non_blocking=True).view(-1, size, size, 3)
            out.index_copy_(0, upload(out_row[on_host], device), pixels)
        event = None
        if streams:
            event = torch.cuda.Event()
            event.record(streams.resample)
    labels = torch.from_numpy(ring.labels[slot, keep])
    if device.type == "cuda":
        labels = labels.pin_memory()  # its copy to the device is then truly asynchronous
    example = ""
    if errors:
        place = max(errors)
        example = f"{path_of(int(ring.rows[slot, place]))}: {errors[place]}"
    failed = int((~ok).sum()) if decoder is not None else 0
    return DecodedStep(out, labels, len(errors), example,
                       int((route == CPU).sum()) + len(here), failed,
                       len(gpu) if decoder is not None else 0, event)


class GpuStage(EventHandoff):
    """The device stage as the loader's hand-over: a slot's step decoded and resampled on the
    device (:func:`decode_slot`); the slot is free again once the device has read it."""

    def __init__(self, ring: GpuRing, device: torch.device, loader: GpuFolderLoader) -> None:
        super().__init__(ring, device)
        self.loader = loader
        self.streams = Streams(device) if device.type == "cuda" else None
        # Page-locked after the fork: the decoder and the copies read the ring directly.
        self._registered = page_lock(int(ring.rows.ctypes.data), ring.nbytes) if self.streams else 0
        self.step: DecodedStep | None = None

    def deliver(self, slot: int, n: int, keep: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.step = decode_slot(self.ring, slot, n, self.loader.decoder,  # type: ignore[arg-type]
                                self.device, self.streams, self.loader.ds.reader.name)
        if self.step.event is not None:
            self._last[slot] = self.step.event
        return self.step.images, self.step.labels

    def close(self) -> None:
        if self.streams:
            self.streams.synchronize()
        self.copying.clear()
        self._last.clear()
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = 0


class GpuFolderLoader(FolderLoader):
    """One rank's GPU decoding for one trial: the CPU path's loader (planning, ring, worker
    processes, the next pass decoded ahead) with the host stage as its workers' job and the
    device stage as its hand-over, run by one thread per pass, two steps ahead of training."""

    job = staticmethod(stage_chunk)

    def __init__(self, ds: GpuImageFolderDataset, rank: int, world: int, per_rank: int,
                 seed: int, device: torch.device, plan: Any) -> None:
        self.decoder: JpegDecoder | None = ds.decoder
        self.failed_steps = 0
        self.gave_up = ""
        super().__init__(ds, rank, world, per_rank, seed, device, plan)

    def _make_ring(self, capacity: int, shared: bool) -> Any:
        return GpuRing(self.plan.slots, capacity, self.ds.image_size, shared)

    def _make_handoff(self) -> HostHandoff:
        return GpuStage(self.ring, self.device, self)

    def _judge(self, step: DecodedStep) -> None:
        """Give the decoder up after GIVE_UP_STEPS steps in a row failed every image."""
        if step.gpu_given and step.gpu_failed == step.gpu_given:
            self.failed_steps += 1
            if self.failed_steps >= GIVE_UP_STEPS and self.decoder is not None:
                self.gave_up = f"{self.decoder.name} failed every image of {self.failed_steps} steps"
                self.decoder = None
                self.ds.path_note = self.gave_up  # type: ignore[attr-defined]
        elif step.gpu_given:
            self.failed_steps = 0

    def _produce(self, split: str, epoch: int, out: queue.Queue[Any],
                 stop: threading.Event) -> None:
        try:
            steps: Any = FolderLoader.passes(self, split, epoch)  # a generator: closed below
            try:
                for images, labels, bad, example in steps:
                    step = self.handoff.step  # type: ignore[attr-defined]
                    self._judge(step)
                    item = (images, labels, bad + step.unreadable, step.example or example,
                            step.cpu_decoded, step.event)
                    while not stop.is_set():
                        try:
                            out.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        break
            finally:
                steps.close()
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread
            out.put(exc)
            return
        out.put(None)

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step, as the CPU path's loader gives them."""
        out: queue.Queue[Any] = queue.Queue(maxsize=DEPTH)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(split, epoch, out, stop),
                                  name="automlperf-decode", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                images, labels, bad, example, cpu_decoded, event = item
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    images.record_stream(current)
                self.ds.cpu_decoded += cpu_decoded
                yield images, labels.to(self.device, non_blocking=True), bad, example
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    out.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()


class GpuImageFolderDataset(ImageFolderDataset):
    """The image folders decoded on the GPU with nvJPEG (see the module's description);
    ``decoder`` stands in for the library (tests give a CPU one)."""

    decodes_on_gpu = True  # the rank's compile workers take the cores its workers leave idle

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 index_dir: Path | str | None = None, decoder: JpegDecoder | None = None,
                 chunk_images: int = GPU_CHUNK_IMAGES) -> None:
        super().__init__(root, image_size, workers, "imagenet", index_dir,
                         chunk_images=chunk_images)
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
        place = GpuRing.bytes_per_place(self.image_size)
        budget = fit_shared_budget(self.shared_budget, per_rank, self.workers, world, place,
                                   shm_free())
        plan = plan_loader(per_rank, self.workers, place, device.type == "cuda", budget,
                           self.chunk_images)
        slots = min(plan.slots, GPU_SLOTS)
        ring = slots * (per_rank + 2) * place
        plan = replace(plan, slots=slots, shared_bytes=ring if self.workers else 0,
                       pinned_bytes=ring if device.type == "cuda" else 0)
        return GpuFolderLoader(self, rank, world, per_rank, seed, device, plan)
