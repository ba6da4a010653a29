"""ImageNet decoded by worker processes, its images read from the official archives or from a
folder through the dataset layer's reader (dataset/reader.py): random-resized-crop and flip for
training, resize and centre crop for validation (train/data/transform.py, the one reference
every decoder obeys). One loader per trial (train/data/loader.py) keeps its workers for every
pass; they take chunks of a batch from one queue and write the images in place into a ring of
batch slots in shared memory, within a byte budget, handed over as NHWC uint8 (channels-last
on the device at no cost). Unreadable files are left out and counted, one of them kept as an
example."""

from __future__ import annotations

import atexit
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.train.data.base import IMAGENET_MEAN, IMAGENET_STD, DataError, Dataset
from automlperf.dataset.index import DatasetIdentityError
from automlperf.dataset.reader import Reader, reader_for
from automlperf.train.data.index import load_index, scan_image_folder
from automlperf.train.data.loader import FolderLoader, close_open_loaders
from automlperf.train.data.transform import decode_file
from automlperf.train.data.valcache import ValidationCache, shard_images

# Decoded images in flight per rank, in shared memory between the decoding workers and the
# rank: whole per-rank batches at 224 px are ~170 MB each at an H100's batch, and a few per
# rank exhaust /dev/shm on nodes and in containers.
SHARED_BUDGET = 512 * 2**20
# The most images a worker decodes per task: small, so that every worker helps with every
# batch, the first batch of a pass comes after one chunk's time, not one batch's, and the
# workers finish a pass together, while a task still costs the rank little
# (bench/RESULTS.md, "What the code's comments rest on").
CHUNK_IMAGES = 8
# Batch slots of the ring: one the rank uses, one or two being copied to the device, the rest
# being decoded, so that a slow chunk does not leave the workers without work.
MAX_SLOTS = 8
SLOT_EXTRA = 16  # bytes per image beside its pixels: its label and its row


@dataclass(frozen=True)
class LoaderPlan:
    """How a rank's decoding is split, and the memory it holds: ``slots`` batches in a ring
    in shared memory (``shared_bytes``), page-locked on GPUs (``pinned_bytes``)."""

    chunk: int
    slots: int
    shared_bytes: int
    pinned_bytes: int


def plan_loader(per_rank: int, workers: int, image_bytes: int, pinned: bool,
                budget: int = SHARED_BUDGET, chunk: int = CHUNK_IMAGES) -> LoaderPlan:
    """Batch slots within ``budget`` (at least one), and a chunk size that gives every
    worker a share of each batch. Without workers the rank decodes into one slot of its own
    memory (two on GPUs: one copied while the next is decoded)."""
    capacity = per_rank + 2
    slot_bytes = capacity * (image_bytes + SLOT_EXTRA)
    if workers:
        slots = max(1, min(MAX_SLOTS, budget // slot_bytes))
    else:
        slots = 2 if pinned else 1
    chunk = max(1, min(chunk, math.ceil(capacity / max(1, workers))))
    ring = slots * slot_bytes
    return LoaderPlan(chunk, slots, ring if workers else 0, ring if pinned else 0)


# Where the ring of batch slots lives (train/data/ring.py).
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
    rank: half of its share (its node's other ranks load too, and other programs use
    ``/dev/shm``), never less than one batch slot. A share that cannot hold one batch is
    refused in one line, before the ring is made."""
    if free is None or workers < 1:
        return budget
    share = free // max(1, world)
    needed = (per_rank + 2) * (image_bytes + SLOT_EXTRA)
    if share < needed:
        raise DataError(f"{SHM_DIR} has {_size(share)} free per rank but decoding batches of "
                        f"{per_rank} images with {workers} worker(s) needs {_size(needed)}: "
                        f"enlarge {SHM_DIR} (a container's --shm-size) or set data.workers = 0")
    fitted = min(budget, max(needed, share // 2))
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


class _FolderChunks:
    """Decodes images of a dataset as the workers do (kept for callers that decode one image
    at a time)."""

    def __init__(self, reader: Reader, size: int, seed: int) -> None:
        self.reader, self.index, self.size, self.seed = reader, reader.index, size, seed

    def _decode(self, row: int, train: bool, epoch: int, out: np.ndarray) -> str | None:
        """Decode one image into ``out``; None, or why it cannot be read."""
        try:
            source = self.reader.image(row)
        except OSError as exc:
            return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return decode_file(source, self.size, train, self.seed, epoch, row, out)


# A process that exits without releasing its loaders (a script, a test) ends their workers
# first; registered after multiprocessing's own exit handler, so it runs before.
atexit.register(close_open_loaders)
_FolderLoader = FolderLoader  # the name the rank-state test counts


class ImageFolderDataset(Dataset):
    """ImageNet from its archives or a folder, decoded by worker processes, one loader per
    trial. Its ``reader`` (made here, in the rank: an archive is opened once, held to the
    identity the run proved, and shared with the workers it forks) reads every image."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 name: str = "imagenet", index_dir: Path | str | None = None,
                 shared_budget: int = SHARED_BUDGET, chunk_images: int = CHUNK_IMAGES) -> None:
        super().__init__()
        if root is None:
            raise DataError("imagenet needs --data-dir: the folder holding the ILSVRC-2012 "
                            "archives, or a folder with train/<class>/*.JPEG and "
                            "val/<class>/*.JPEG")
        self.root = Path(root)
        self.index = load_index(index_dir, self.root) if index_dir else scan_image_folder(self.root)
        try:
            self.reader: Reader = reader_for(self.index)
        except DatasetIdentityError as exc:
            raise DataError(str(exc)) from None
        except OSError as exc:
            raise DataError(f"{self.root}: the data cannot be opened ({exc})") from None
        self.classes = self.index.classes
        self.name, self.num_classes, self.channels = name, len(self.classes), 3
        self.image_size, self.workers = image_size, workers
        self.shared_budget, self.chunk_images = shared_budget, chunk_images
        self.train_size, self.val_size = self.index.train_size, self.index.val_size
        self.official = name == "imagenet" and len(self.classes) == 1000
        self._mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
        self._std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
        self._loader: Any = None
        self.val_cache = True  # data.val_cache: keep the validation shard on the device
        self.decode_choice = ""  # why this path decodes (data.load says)
        self._val = ValidationCache()
        self._last_pass = False  # the next pass is the trial's last (expect_next(None))

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
        size = self.image_size
        image = size * size * 3
        budget = fit_shared_budget(self.shared_budget, per_rank, self.workers, world, image,
                                   shm_free())
        plan = plan_loader(per_rank, self.workers, image, device.type == "cuda", budget,
                           self.chunk_images)
        return FolderLoader(self, rank, world, per_rank, seed, device, plan)

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        loader = self.loader(rank, world, batch_size, seed, device)
        mean, std = self._mean.to(device), self._std.to(device)
        for x, y, bad, example in self._passes(loader, split, epoch):
            self.skipped += bad
            self.unreadable = example or self.unreadable
            # NHWC seen as NCHW is channels-last: the network's preferred layout on GPUs.
            x = x.permute(0, 3, 1, 2).float()
            yield (x - mean) / std, y

    def _passes(self, loader: Any, split: str, epoch: int) -> Iterator[tuple[Any, ...]]:
        """The loader's pass, or validation replayed from the device once it was kept there;
        with validation kept, the workers decode the next training epoch after this one."""
        key = loader.key()
        last, self._last_pass = self._last_pass, False
        if split == "val" and self._val.holds(key):
            return self._val.replay()
        if split == "train" and self._val.holds(key):
            self.expect_next(("train", epoch + 1))
        if split != "val" or not self.val_cache or last:
            # The trial's last pass is not kept: nothing would replay it.
            return loader.passes(split, epoch)
        rank, world, per_rank, seed, device = key
        images = shard_images(self.val_size, rank, world, per_rank, seed)
        nbytes = images * (self.image_size ** 2 * 3 + 8)
        return self._val.fill(key, nbytes, device, world, loader.passes(split, epoch))

    @property
    def val_cache_note(self) -> str:
        """Whether this trial's validation is replayed from the device, and why not."""
        if self._val.key is not None:
            return "kept on the device"
        return self._val.refused or ("off (data.val_cache)" if not self.val_cache else "")

    def notes(self) -> dict[str, str]:
        notes = {"decode_path": self.decode_choice} if self.decode_choice else {}
        if note := self.val_cache_note:
            notes["validation"] = note
        return notes

    def expect_next(self, after: tuple[str, int] | None) -> None:
        self._last_pass = after is None
        if after is None and self._val.key is not None:
            # Nothing follows, and validation needs no decoding: what the workers planned
            # ahead (the next training epoch) is dropped.
            drop = getattr(self._loader, "drop_ahead", None)
            if drop is not None:
                drop()
            return
        expect = getattr(self._loader, "expect", None)
        if expect is not None:
            expect(after)

    def release(self) -> None:
        self._val.clear()
        self._last_pass = False
        if self._loader is not None:
            self._loader.close()
            self._loader = None
