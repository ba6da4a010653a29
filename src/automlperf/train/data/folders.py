"""ImageNet-style folders decoded by DataLoader worker processes: random-resized-crop and
flip for training, resize and centre crop for validation. One loader per trial keeps its
workers for every pass, decodes in small chunks within a byte budget of shared memory, and
hands over NHWC uint8 (channels-last on the device at no cost). Unreadable files are left
out and counted, one of them kept as an example."""

from __future__ import annotations

import atexit
import functools
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.train.data.base import IMAGENET_MEAN, IMAGENET_STD, DataError, Dataset, step_plan
from automlperf.train.data.index import FileIndex
from automlperf.train.data.transform import decode_file


# Decoded images in flight per rank, in shared memory between the decoding workers and the
# rank: whole per-rank batches at 224 px are ~170 MB each, and a few per worker exhaust
# /dev/shm on nodes and in containers.
SHARED_BUDGET = 512 * 2**20
# Images a worker decodes per task: small, so that every worker helps with every batch and
# the first batch of an epoch comes after one chunk's time, not one batch's.
CHUNK_IMAGES = 32
MAX_PREFETCH = 4
PINNED_BATCHES = 2  # the batch being copied to the device and the one being assembled


@dataclass(frozen=True)
class LoaderPlan:
    """How a rank's decoding is split, and the memory that may be in flight."""

    chunk: int
    prefetch: int
    shared_bytes: int
    pinned_bytes: int


def plan_loader(per_rank: int, workers: int, image_bytes: int, pinned: bool,
                budget: int = SHARED_BUDGET, chunk: int = CHUNK_IMAGES) -> LoaderPlan:
    """Chunk size and prefetch depth that keep the decoded images in flight within
    ``budget``; pinned memory holds ``PINNED_BATCHES`` batches, allocated once per trial."""
    slots = max(1, workers)
    chunk = max(1, min(chunk, per_rank + 2, budget // (slots * image_bytes)))
    prefetch = max(1, min(MAX_PREFETCH, budget // (slots * chunk * image_bytes)))
    shared = workers * prefetch * chunk * image_bytes
    pinned_bytes = PINNED_BATCHES * (per_rank + 2) * image_bytes if pinned else 0
    return LoaderPlan(chunk, prefetch, shared, pinned_bytes)


# Where torch's worker processes put the tensors they hand to the rank (shm_open).
SHM_DIR = "/dev/shm"
_shm_warned = False


def shm_free(path: str = SHM_DIR) -> int | None:
    """Bytes free in the shared memory the decoding workers use (None where it is absent)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def fit_shared_budget(budget: int, per_rank: int, workers: int, world: int, image_bytes: int,
                      free: int | None) -> int:
    """The shared-memory budget of one rank's loader, cut to what ``free`` bytes allow this
    rank (a share of them: its node's other ranks load too, and a step's chunks stay in
    shared memory until the batch is assembled). A budget that cannot hold even one image
    per worker beside one batch is refused in one line, before a worker fails on it."""
    if free is None or workers < 1:
        return budget
    share = free // max(1, world)
    batch = (per_rank + 2) * image_bytes
    needed = batch + workers * image_bytes
    if share < needed:
        raise DataError(f"{SHM_DIR} has {_size(share)} free per rank but decoding batches of "
                        f"{per_rank} images with {workers} worker(s) needs {_size(needed)}: "
                        f"enlarge {SHM_DIR} (a container's --shm-size) or set data.workers = 0")
    fitted = min(budget, max(workers * image_bytes, (share - batch) // 2))
    global _shm_warned
    if fitted < budget and not _shm_warned:
        import logging

        _shm_warned = True  # once per rank process, not per trial
        logging.getLogger("automlperf.data").warning(
            "%s has %s free: decoding with %s of shared memory per rank instead of %s "
            "(slower; enlarge %s for full speed)", SHM_DIR, _size(free), _size(fitted),
            _size(budget), SHM_DIR)
    return fitted


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


class _FolderChunks(torch.utils.data.Dataset):
    """Decodes a chunk of images in a worker process into one NHWC uint8 tensor in shared
    memory; unreadable files are left out and counted."""

    def __init__(self, index: FileIndex, size: int, seed: int) -> None:
        self.index, self.size, self.seed = index, size, seed

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: tuple[bool, int, tuple[int, ...]]
                    ) -> tuple[torch.Tensor, torch.Tensor, int, str]:
        """(images, labels, unreadable count, the last unreadable file and why)."""
        train, epoch, rows = key
        s = self.size
        images = torch.empty((len(rows), s, s, 3), dtype=torch.uint8)
        if torch.utils.data.get_worker_info() is not None:
            images.share_memory_()  # written in place, sent to the rank without a copy
        labels = torch.empty(len(rows), dtype=torch.long)
        pixels = images.numpy()
        n = 0
        example = ""
        for row in rows:
            error = self._decode(row, train, epoch, pixels[n])
            if error is None:
                labels[n] = int(self.index.labels[row])
                n += 1
            else:
                path = self.index.path(row)
                example = f"{path}: {error.replace(' ' + repr(path), '')}"
        return images[:n], labels[:n], len(rows) - n, example

    def _decode(self, row: int, train: bool, epoch: int, out: np.ndarray) -> str | None:
        """Decode one image into ``out``; None, or why it cannot be read."""
        return decode_file(self.index.path(row), self.size, train, self.seed, epoch, row, out)


def _no_collate(chunk: Any) -> Any:
    return chunk


def _worker_init(rank_pid: int, _worker_id: int) -> None:
    """A data-loading worker dies with its rank, even when the rank is killed outright, and
    ignores SIGTERM, as its rank does: a batch system signals every process of a step, and
    PyTorch's worker handler would die of it and fail the trial under a shutdown that the
    replica runs in order."""
    import signal

    from automlperf.procutil import die_with_parent

    die_with_parent(rank_pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _ChunkSampler(torch.utils.data.Sampler[Any]):
    """The chunks of one pass, set before each pass: the loader's workers persist across
    epochs, so the epoch travels with every chunk rather than living in the workers."""

    def __init__(self) -> None:
        self.keys: list[tuple[bool, int, tuple[int, ...]]] = []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


_open_loaders: weakref.WeakSet[_FolderLoader] = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    """A process that exits without releasing its loaders (a script, a test) ends their
    workers first; registered after multiprocessing's own exit handler, so it runs before."""
    for loader in list(_open_loaders):
        loader.close()


class _FolderLoader:
    """One rank's loader for one trial: the decoding workers start once and serve every
    training and validation pass; batches are assembled from small chunks, in pinned
    buffers on GPUs (allocated once, reused), and copied to the device as NHWC uint8."""

    def __init__(self, ds: ImageFolderDataset, rank: int, world: int, per_rank: int, seed: int,
                 device: torch.device) -> None:
        self.ds, self.rank, self.world, self.per_rank = ds, rank, world, per_rank
        self.seed, self.device = seed, device
        self.pinned = device.type == "cuda"
        size = ds.image_size
        budget = fit_shared_budget(ds.shared_budget, per_rank, ds.workers, world,
                                   size * size * 3, shm_free())
        self.plan = plan_loader(per_rank, ds.workers, size * size * 3, self.pinned, budget,
                                ds.chunk_images)
        self.sampler = _ChunkSampler()
        workers = ds.workers
        self.loader = torch.utils.data.DataLoader(
            _FolderChunks(ds.index, size, seed), batch_size=None, sampler=self.sampler,
            collate_fn=_no_collate, num_workers=workers,
            prefetch_factor=self.plan.prefetch if workers else None,
            persistent_workers=workers > 0,
            multiprocessing_context="fork" if workers else None,
            worker_init_fn=functools.partial(_worker_init, os.getpid()) if workers else None)
        self._buffers: list[torch.Tensor] = []
        self._copied: list[Any] = []
        self._slot = 0
        _open_loaders.add(self)

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.world, self.per_rank, self.seed, self.device)

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step."""
        train = split == "train"
        base = 0 if train else self.ds.index.train_size
        steps = step_plan(len(self.ds.index.rows(split)), self.rank, self.world, self.per_rank,
                          split, epoch, self.seed)
        chunk = self.plan.chunk
        counts = []
        keys = []
        for rows in steps:
            rows_list = (rows + base).tolist()
            parts = [tuple(rows_list[i:i + chunk]) for i in range(0, len(rows_list), chunk)]
            counts.append(len(parts))
            keys += [(train, epoch, p) for p in parts]
        self.sampler.keys = keys
        chunks = iter(self.loader)
        for n in counts:
            parts = [next(chunks) for _ in range(n)]
            bad = sum(p[2] for p in parts)
            example = next((p[3] for p in parts if p[3]), "")
            labels = torch.cat([p[1] for p in parts]) if parts else torch.empty(0, dtype=torch.long)
            images = self._assemble([p[0] for p in parts], len(labels))
            yield images, labels.to(self.device, non_blocking=True), bad, example

    def _assemble(self, parts: list[torch.Tensor], n: int) -> torch.Tensor:
        s = self.ds.image_size
        if not self.pinned:
            if len(parts) == 1:
                return parts[0]
            return torch.cat(parts) if parts else torch.empty((0, s, s, 3), dtype=torch.uint8)
        if not self._buffers:
            capacity = self.plan.pinned_bytes // PINNED_BATCHES // (s * s * 3)
            self._buffers = [torch.empty((capacity, s, s, 3), dtype=torch.uint8, pin_memory=True)
                             for _ in range(PINNED_BATCHES)]
            self._copied = [None] * PINNED_BATCHES
        slot = self._slot
        self._slot = (slot + 1) % PINNED_BATCHES
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()  # its last copy to the device has finished
        buf = self._buffers[slot][:n]
        if parts:
            torch.cat(parts, out=buf)
        on_device = buf.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._copied[slot] = event
        return on_device

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        workers = list(getattr(iterator, "_workers", None) or [])
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        # Workers ignore SIGTERM, so DataLoader's terminate() cannot end one that did not
        # stop when asked, and multiprocessing would wait for it forever at exit.
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=10)
        _open_loaders.discard(self)
        self.loader = None  # type: ignore[assignment]
        self._buffers, self._copied = [], []


class ImageFolderDataset(Dataset):
    """ImageNet-style folders decoded by DataLoader worker processes, one loader per trial."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 name: str = "imagenet", index_dir: Path | str | None = None,
                 shared_budget: int = SHARED_BUDGET, chunk_images: int = CHUNK_IMAGES) -> None:
        super().__init__()
        if root is None:
            raise DataError("imagenet needs --data-dir: a folder with train/<class>/*.JPEG and "
                            "val/<class>/*.JPEG")
        self.root = Path(root)
        self.index = FileIndex.load(index_dir) if index_dir else FileIndex.scan(self.root)
        self.classes = self.index.classes
        self.name, self.num_classes, self.channels = name, len(self.classes), 3
        self.image_size, self.workers = image_size, workers
        self.shared_budget, self.chunk_images = shared_budget, chunk_images
        self.train_size, self.val_size = self.index.train_size, self.index.val_size
        self.official = name == "imagenet" and len(self.classes) == 1000
        self._mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
        self._std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
        self._loader: Any = None

    @property
    def decode_path(self) -> str:
        import PIL

        return f"cpu-pillow {PIL.__version__}"

    def loader(self, rank: int, world: int, per_rank: int, seed: int,
               device: torch.device) -> Any:
        """This trial's loader (a new one when the trial's shape changes)."""
        if self._loader is None or self._loader.key() != (rank, world, per_rank, seed, device):
            self.release()
            self._loader = self._new_loader(rank, world, per_rank, seed, device)
        return self._loader

    def _new_loader(self, rank: int, world: int, per_rank: int, seed: int,
                    device: torch.device) -> Any:
        return _FolderLoader(self, rank, world, per_rank, seed, device)

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        loader = self.loader(rank, world, batch_size, seed, device)
        mean, std = self._mean.to(device), self._std.to(device)
        for x, y, bad, example in loader.passes(split, epoch):
            self.skipped += bad
            self.unreadable = example or self.unreadable
            # NHWC seen as NCHW is channels-last: the network's preferred layout on GPUs.
            x = x.permute(0, 3, 1, 2).float()
            yield (x - mean) / std, y

    def release(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None
