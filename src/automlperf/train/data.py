"""Datasets behind one interface: each yields normalised (images, labels) batches on a device,
sharded across data-parallel ranks (the same number of batches on every rank), and counts
the images it actually delivered.

* ``builtin``: the MNIST sample shipped with the package (5,000 images, 10 classes).
* ``digits``: the small handwritten digits shipped with the package (1,797 images of 8x8).
* ``cifar10``: the CIFAR-10 binary or python batches from a local folder (read as data; the
  python batches go through an unpickler that only admits NumPy arrays).
* ``imagenet``: ``train/<class>/*.JPEG`` and ``val/<class>/*.JPEG``, decoded by worker
  processes (or by NVIDIA DALI, on the GPU, when it is installed), random-resized-crop + flip for training,
  resize + centre crop for validation. The file index is scanned once and shared as arrays;
  one loader per trial keeps its workers for every pass, decodes in small chunks within a
  byte budget, and hands over NHWC uint8 (channels-last on the device at no cost).
* ``synthetic``: random tensors made on the device, for throughput only.

Unreadable images are skipped and counted, with one of them kept as an example; whether a
share of them is too many is the trainer's judgement (``max_unreadable``).
"""

from __future__ import annotations

import atexit
import functools
import gzip
import importlib.resources
import io
import json
import math
import os
import pickle
import random
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.config import DataConfig
from automlperf.errors import UserError
from automlperf.train.spec import plan_steps

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png", ".bmp", ".webp"}
_DATA = DataConfig()  # the one source of the data defaults


class DataError(UserError, ValueError):
    """A dataset that is missing or malformed; the message says what to fix."""


class Dataset(ABC):
    """Shards and batches of one dataset; ``skipped`` counts unreadable images so far and
    ``unreadable`` names the last one seen and why (empty while every image was read);
    ``max_unreadable`` is the share of a split's images that may be unreadable in an epoch
    before a trial fails for its data."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    train_size: int
    val_size: int
    official: bool = False

    max_unreadable: float = _DATA.max_unreadable

    def __init__(self) -> None:
        self.skipped = 0
        self.unreadable = ""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    @abstractmethod
    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches, the same number on every rank (see :func:`step_plan`)."""

    def release(self) -> None:
        """Free what one trial's passes hold (worker processes, pinned buffers)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "classes": self.num_classes, "image_size": self.image_size,
                "channels": self.channels, "train_images": self.train_size,
                "val_images": self.val_size, "official": self.official}


def step_plan(n: int, rank: int, world: int, per_rank: int, split: str, epoch: int,
              seed: int) -> list[torch.Tensor]:
    """This rank's images, step by step. Every rank takes the same number of steps (so no
    rank waits in an all-reduce that another never starts) and every image is used once per
    epoch over all ranks; a rank's share of a step differs from another's by at most one."""
    if split == "train":
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=gen)
    else:
        order = torch.arange(n)
    batch = per_rank * world
    steps = plan_steps(n, world, per_rank)
    return [order[s * batch:n if s == steps - 1 else (s + 1) * batch][rank::world]
            for s in range(steps)]


# --- in-memory datasets -------------------------------------------------------------------
class TensorDataset(Dataset):
    """Images kept in memory as uint8 (N, C, H, W); augmentation runs on the device."""

    def __init__(self, name: str, train: tuple[torch.Tensor, torch.Tensor],
                 val: tuple[torch.Tensor, torch.Tensor], num_classes: int,
                 mean: tuple[float, ...], std: tuple[float, ...], image_size: int,
                 flip: bool, shift: int, scale: float = 255.0) -> None:
        super().__init__()
        self.name, self.num_classes = name, num_classes
        self._train, self._val = train, val
        self.channels = train[0].shape[1]
        self.image_size = image_size
        self.train_size, self.val_size = len(train[1]), len(val[1])
        self._mean = torch.tensor(mean).view(1, -1, 1, 1) * scale
        self._std = torch.tensor(std).view(1, -1, 1, 1) * scale
        self._flip, self._shift = flip, shift
        self._on: dict[torch.device, tuple[Any, ...]] = {}

    def _device_copy(self, device: torch.device) -> tuple[Any, ...]:
        if device not in self._on:
            self._on[device] = (self._train[0].to(device), self._train[1].to(device),
                                self._val[0].to(device), self._val[1].to(device),
                                self._mean.to(device), self._std.to(device))
        return self._on[device]

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        tx, ty, vx, vy, mean, std = self._device_copy(device)
        x_all, y_all = (tx, ty) if split == "train" else (vx, vy)
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + epoch * 31 + rank)
        for rows in step_plan(len(y_all), rank, world, batch_size, split, epoch, seed):
            sel = rows.to(device)
            x = x_all.index_select(0, sel).float()
            if split == "train":
                x = self._augment(x, gen)
            x = (x - mean) / std
            yield _resize(x, self.image_size), y_all.index_select(0, sel)

    def _augment(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n, _, h, w = x.shape
        if self._shift:
            s = self._shift
            padded = torch.nn.functional.pad(x, (s, s, s, s))
            dy = torch.randint(0, 2 * s + 1, (n,), generator=gen, device=x.device)
            dx = torch.randint(0, 2 * s + 1, (n,), generator=gen, device=x.device)
            rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
            cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
            batch = torch.arange(n, device=x.device)[:, None, None, None]
            chans = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
            x = padded[batch, chans, rows, cols]
        if self._flip:
            mask = torch.rand(n, generator=gen, device=x.device) < 0.5
            x = torch.where(mask[:, None, None, None], x.flip(3), x)
        return x


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                           align_corners=False, antialias=x.shape[-1] > size)


def _packaged_table(name: str, columns: int) -> np.ndarray:
    """Rows of pixels then a label, from a gzipped CSV shipped in automlperf/data."""
    raw = (importlib.resources.files("automlperf") / "data" / name).read_bytes()
    table = np.loadtxt(io.BytesIO(gzip.decompress(raw)), delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != columns:
        raise DataError(f"{name}: expected {columns} columns per row, found {table.shape}; "
                        "reinstall automlperf")
    return table


def _stratified_split(labels: np.ndarray, val_per_class: int, seed: int) -> np.ndarray:
    """A fixed validation mask: ``val_per_class`` images of each class, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    val_idx = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:val_per_class]
                              for c in range(int(labels.max()) + 1)])
    is_val = np.zeros(len(labels), dtype=bool)
    is_val[val_idx] = True
    return is_val


def builtin(image_size: int = 12) -> TensorDataset:
    """The MNIST sample shipped with automlperf (see data/MNIST-LICENSE.txt): 2,000 training
    and 3,000 validation images (a fixed stratified split), 28x28 grey levels 0..255,
    resized to ``image_size``. Few training images at a low resolution keep a short CPU run
    below 100 % validation accuracy, so architectures can still be told apart; many
    validation images make accuracy steps of 1/3,000."""
    table = _packaged_table("mnist_5k.csv.gz", 785)
    images = torch.from_numpy(table[:, :784].astype(np.uint8)).view(-1, 1, 28, 28)
    labels = torch.from_numpy(table[:, 784])
    is_val = _stratified_split(table[:, 784], 300, 20240601)
    train = (images[~is_val], labels[~is_val])
    val = (images[is_val], labels[is_val])
    # MNIST's usual pixel mean and spread; flips would change digits.
    return TensorDataset("builtin", train, val, 10, (0.1307,), (0.3081,), image_size,
                         flip=False, shift=2)


def digits(image_size: int = 8) -> TensorDataset:
    """The small handwritten digits shipped with automlperf (see data/DIGITS-LICENSE.txt):
    1,437 training and 360 validation images (a fixed stratified split), 8x8 grey levels
    0..16, resized to ``image_size``. The fastest real task, for tests."""
    table = _packaged_table("digits.csv.gz", 65)
    images = torch.from_numpy(table[:, :64].astype(np.uint8)).view(-1, 1, 8, 8)
    labels = torch.from_numpy(table[:, 64])
    is_val = _stratified_split(table[:, 64], 36, 20240601)
    train = (images[~is_val], labels[~is_val])
    val = (images[is_val], labels[is_val])
    # Mean and spread of the training pixels (grey levels 0..16); flips would change digits.
    return TensorDataset("digits", train, val, 10, (4.88,), (6.02,), image_size,
                         flip=False, shift=1, scale=1.0)


def _cifar_unpickle(data: bytes) -> dict[Any, Any]:
    class NumpyOnly(pickle.Unpickler):
        # What NumPy arrays pickle to; _codecs.encode turns protocol-2 text into bytes.
        allowed = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                   ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                   ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) not in self.allowed:
                raise pickle.UnpicklingError(f"refusing {module}.{name}: CIFAR batches hold "
                                             "only arrays and lists")
            return super().find_class(module, name)

    return NumpyOnly(io.BytesIO(data), encoding="bytes").load()


def cifar10(data_dir: Path | str | None, image_size: int = 32) -> TensorDataset:
    """CIFAR-10 from ``data_dir`` (or its cifar-10-batches-bin / -py sub-folder)."""
    if data_dir is None:
        raise DataError("cifar10 needs --data-dir: a folder with CIFAR-10's data_batch_1..5 "
                        "and test_batch (binary .bin or python version)")
    root = Path(data_dir)
    candidates = [root, root / "cifar-10-batches-bin", root / "cifar-10-batches-py"]
    for folder in candidates:
        if (folder / "data_batch_1.bin").is_file():
            read, names, suffix = _cifar_bin, [f"data_batch_{i}" for i in range(1, 6)], ".bin"
            break
        if (folder / "data_batch_1").is_file():
            read, names, suffix = _cifar_py, [f"data_batch_{i}" for i in range(1, 6)], ""
            break
    else:
        raise DataError(f"{root}: no CIFAR-10 batches found (expected data_batch_1..5 and "
                        "test_batch, binary or python version)")
    try:
        parts = [read(folder / f"{n}{suffix}") for n in names]
        test = read(folder / f"test_batch{suffix}")
    except FileNotFoundError as exc:
        raise DataError(f"{exc.filename}: missing CIFAR-10 batch file") from None
    train = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    return TensorDataset("cifar10", train, test, 10, (0.4914, 0.4822, 0.4465),
                         (0.2470, 0.2435, 0.2616), image_size, flip=True, shift=4)


def _cifar_bin(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if raw.size % 3073:
        raise DataError(f"{path}: size {raw.size} is not a multiple of 3073-byte records; "
                        "is it a CIFAR-10 binary batch?")
    rec = raw.reshape(-1, 3073)
    labels = rec[:, 0].astype(np.int64)
    if labels.max(initial=0) > 9:
        raise DataError(f"{path}: label {labels.max()} out of range 0..9")
    return torch.from_numpy(rec[:, 1:].reshape(-1, 3, 32, 32).copy()), torch.from_numpy(labels)


def _cifar_py(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        batch = _cifar_unpickle(path.read_bytes())
        data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError, TypeError) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(data)} images but {len(labels)} labels")
    return torch.from_numpy(data.copy()), torch.from_numpy(labels)


# --- synthetic ----------------------------------------------------------------------------
class SyntheticDataset(Dataset):
    """Random images made on the device: measures compute throughput, not accuracy."""

    def __init__(self, image_size: int, num_classes: int, train_images: int,
                 channels: int = 3) -> None:
        super().__init__()
        self.name, self.num_classes, self.channels = "synthetic", num_classes, channels
        self.image_size = image_size
        self.train_size, self.val_size = train_images, max(1, train_images // 4)

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sizes = [len(rows) for rows in step_plan(
            self.train_size if split == "train" else self.val_size, rank, world, batch_size,
            split, epoch, seed)]
        gen = torch.Generator(device=device).manual_seed(seed + epoch * 31 + rank)
        shape = (max(sizes), *self.input_shape)
        x = torch.randn(shape, generator=gen, device=device)
        for size in sizes:
            y = torch.randint(0, self.num_classes, (size,), generator=gen, device=device)
            yield x[:size], y


# --- image folders ------------------------------------------------------------------------
def scan_image_folder(root: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """Classes (from train/) and (path, label) lists of train/ and val/."""
    splits: dict[str, list[tuple[str, int]]] = {}
    classes: list[str] = []
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise DataError(f"{folder} not found: an imagenet data dir needs "
                            "train/<class>/*.JPEG and val/<class>/*.JPEG (or a flat val/ with "
                            "LOC_val_solution.csv)")
        found = sorted(e.name for e in os.scandir(folder) if e.is_dir())
        if not found and split == "val":
            splits[split] = _flat_val(root, classes)
            continue
        if not found:
            raise DataError(f"{folder} has no class folders (expected {split}/<class>/*.JPEG)")
        if split == "train":
            classes = found
        elif set(found) - set(classes):
            extra = sorted(set(found) - set(classes))[0]
            raise DataError(f"{folder / extra}: class {extra!r} is not in train/")
        index = {c: i for i, c in enumerate(classes)}
        items = []
        for cls in found:
            for entry in os.scandir(folder / cls):
                if entry.is_file() and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                    items.append((entry.path, index[cls]))
        if not items:
            raise DataError(f"{folder}: no images (.JPEG, .jpg, .png) in the class folders")
        items.sort()
        splits[split] = items
    return classes, splits


def _flat_val(root: Path, classes: list[str]) -> list[tuple[str, int]]:
    """A flat val/ folder labelled by a ground-truth file (see dataset_identity.py)."""
    from automlperf.dataset_identity import DatasetIdentityError, flat_val_labels

    try:
        labels = flat_val_labels(root)
    except DatasetIdentityError as exc:
        raise DataError(str(exc)) from None
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({wnid for wnid in labels.values() if wnid not in index})
    if unknown:
        raise DataError(f"{root / 'val'}: labelled with class {unknown[0]!r}, which is not "
                        "in train/")
    if not labels:
        raise DataError(f"{root / 'val'}: no labelled images")
    return sorted((str(root / "val" / name), index[wnid]) for name, wnid in labels.items())


def random_resized_crop_box(width: int, height: int, rng: random.Random,
                            scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """The crop of the standard ImageNet training recipe: a random area and aspect ratio,
    falling back to a centre crop after ten tries."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


class FileIndex:
    """Every image of a folder dataset as flat arrays: the paths as one UTF-8 buffer with
    offsets, and the labels; training images first, then validation images.

    A list of 1.3 M (path, label) tuples is 1.3 M Python objects whose reference counts a
    forked worker writes to, copying the pages they live on; a few arrays are three objects.
    Saved to a folder, the arrays are memory-mapped by every rank, so the page cache holds
    one copy per node and the folders are scanned once per run, not at every rank start."""

    FILES = ("blob.npy", "offsets.npy", "labels.npy")

    def __init__(self, root: str, classes: list[str], blob: np.ndarray, offsets: np.ndarray,
                 labels: np.ndarray, train_size: int) -> None:
        self.root, self.classes = root, classes
        self.blob, self.offsets, self.labels = blob, offsets, labels
        self.train_size = train_size
        self.val_size = len(labels) - train_size

    @classmethod
    def scan(cls, root: Path | str) -> FileIndex:
        classes, splits = scan_image_folder(Path(root))
        items = splits["train"] + splits["val"]
        encoded = [path.encode() for path, _ in items]
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        labels = np.array([label for _, label in items], dtype=np.int32)
        return cls(str(root), classes, blob, offsets, labels, len(splits["train"]))

    def save(self, folder: Path | str) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, array in zip(self.FILES, (self.blob, self.offsets, self.labels)):
            np.save(folder / name, array)
        meta = {"root": self.root, "classes": self.classes, "train_size": self.train_size}
        (folder / "index.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, folder: Path | str) -> FileIndex:
        folder = Path(folder)
        try:
            meta = json.loads((folder / "index.json").read_text())
            arrays = [np.load(folder / name, mmap_mode="r") for name in cls.FILES]
        except (OSError, ValueError) as exc:
            raise DataError(f"{folder}: the image index cannot be read ({exc}); it is written "
                            "when the training processes start, so start them again") from None
        blob, offsets, labels = arrays
        return cls(meta["root"], meta["classes"], blob, offsets, labels, meta["train_size"])

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, row: int) -> str:
        return bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]).decode()

    def rows(self, split: str) -> range:
        return range(0, self.train_size) if split == "train" else range(self.train_size, len(self))

    def items(self, split: str) -> list[tuple[str, int]]:
        return [(self.path(r), int(self.labels[r])) for r in self.rows(split)]


def prepare_index(data_dir: Path | str | None, folder: Path | str) -> FileIndex:
    """Scan an image-folder dataset once and save its index for the training processes."""
    if data_dir is None:
        raise DataError("imagenet needs --data-dir: a folder with train/<class>/*.JPEG and "
                        "val/<class>/*.JPEG")
    index = FileIndex.scan(data_dir)
    index.save(folder)
    return index


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


def _seeded(seed: int, epoch: int, row: int) -> random.Random:
    return random.Random((seed * 1_000_003 + epoch) * 10_000_019 + row)


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
        from PIL import Image, UnidentifiedImageError

        size = self.size
        bilinear = Image.Resampling.BILINEAR
        try:
            with Image.open(self.index.path(row)) as file:
                width, height = file.size
                if train:
                    rng = _seeded(self.seed, epoch, row)
                    left, top, right, bottom = random_resized_crop_box(width, height, rng)
                    flip = rng.random() < 0.5
                    # JPEG decodes at 1/2, 1/4 or 1/8 scale when the crop stays at least
                    # `size` pixels wide and high: most of the decoding cost saved.
                    file.draft("RGB", (math.ceil(width * size / (right - left)),
                                       math.ceil(height * size / (bottom - top))))
                    sx, sy = file.width / width, file.height / height
                    img = _rgb(file).resize(
                        (size, size), bilinear, box=(left * sx, top * sy, right * sx, bottom * sy))
                    if flip:
                        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                else:
                    short = round(size / 0.875)  # 256 for 224
                    scale = short / min(width, height)
                    file.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
                    img = _rgb(file)
                    scale = short / min(img.width, img.height)
                    img = img.resize((max(short, round(img.width * scale)),
                                      max(short, round(img.height * scale))), bilinear)
                    left = (img.width - size) // 2
                    top = (img.height - size) // 2
                    img = img.crop((left, top, left + size, top + size))
                out[...] = np.asarray(img, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
            return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return None


def _rgb(image: Any) -> Any:
    """An image as 8-bit RGB. 16-bit greyscale (PNG, TIFF) is scaled to 8 bits: Pillow's own
    conversion clips it, turning most such images white."""
    if image.mode.startswith("I"):
        from PIL import Image

        wide = np.asarray(image).astype(np.int64)
        return Image.fromarray(np.clip(wide >> 8, 0, 255).astype(np.uint8), "L").convert("RGB")
    return image.convert("RGB")


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


def dali_available() -> bool:
    """Whether NVIDIA DALI can be imported (the ``dali`` extra)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


class _DaliLoader:
    """One rank's DALI pipelines for one trial, training and validation, each built once and
    fed the step plan's files step by step, so every rank takes the same steps and every
    image is used once per epoch, as with the worker loader. Rebuilding a pipeline per epoch
    would leave DALI's device memory pool to grow. Images come out as NHWC uint8: no layout
    copy for channels-last, a quarter of the bytes of float CHW.

    Files DALI cannot decode are counted, not fatal: a step whose batch fails is decoded
    again without the files that fail on their own."""

    def __init__(self, ds: ImageFolderDataset, rank: int, world: int, per_rank: int, seed: int,
                 device: torch.device) -> None:
        self.ds, self.rank, self.world, self.per_rank = ds, rank, world, per_rank
        self.seed, self.device = seed, device
        self.gpu = device.type == "cuda"
        self._pipes: dict[bool, Any] = {}
        self._probe: Any = None

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.world, self.per_rank, self.seed, self.device)

    def _build(self, train: bool, batch: int) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        size = self.ds.image_size
        decoder = "mixed" if self.gpu else "cpu"

        # One batch in flight (prefetch depth 1): each step's files are given with the run
        # that decodes them, so a decoding error belongs to that step. A CPU-only pipeline
        # has no device.
        device: dict[str, Any] = {"device_id": (self.device.index or 0) if self.gpu else None}

        @pipeline_def(batch_size=batch, num_threads=max(1, self.ds.workers),
                      seed=(self.seed * 2 + train) % 2**31, prefetch_queue_depth=1, **device)
        def pipe():
            files = fn.external_source(name="files", dtype=types.UINT8, ndim=1)
            if train:
                images = fn.decoders.image_random_crop(files, device=decoder,
                                                       output_type=types.RGB)
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(files, device=decoder, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=round(size / 0.875))
                mirror = 0
            return fn.crop_mirror_normalize(images, crop=(size, size), mirror=mirror,
                                            dtype=types.UINT8, output_layout="HWC")

        built = pipe()
        built.build()
        return built

    def _pipeline(self, train: bool) -> Any:
        if train not in self._pipes:
            # The longest share of a step: the per-rank batch and a small remainder.
            self._pipes[train] = self._build(train, self.per_rank + 2)
        return self._pipes[train]

    def _run(self, train: bool, files: list[np.ndarray]) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

        (out,) = self._pipeline(train).run(files=files)
        return to_torch_tensor(out.as_tensor(), copy=True)

    def _decodable(self, data: np.ndarray) -> bool:
        """Whether one file decodes on its own, in a one-image pipeline with the same decoder."""
        if self._probe is None:
            self._probe = self._build(False, 1)
        try:
            self._probe.run(files=[data])
        except RuntimeError:
            return False
        return True

    def _decode(self, train: bool, rows: list[int]) -> tuple[torch.Tensor, list[int]]:
        files: list[np.ndarray] = []
        kept: list[int] = []
        for row in rows:
            try:
                data = np.fromfile(self.ds.index.path(row), dtype=np.uint8)
            except OSError:
                continue
            if data.size:
                files.append(data)
                kept.append(row)
        s = self.ds.image_size
        if files:
            try:
                return self._run(train, files), kept
            except RuntimeError:
                good = [i for i, data in enumerate(files) if self._decodable(data)]
                files, kept = [files[i] for i in good], [kept[i] for i in good]
            if files:
                try:
                    return self._run(train, files), kept
                except RuntimeError:
                    # DALI pipelines outlive an operator's error; one that did not is built
                    # again, once.
                    self._pipes.pop(train, None)
                    self._probe = None
                    return self._run(train, files), kept
        return torch.empty((0, s, s, 3), dtype=torch.uint8, device=self.device), kept

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step."""
        train = split == "train"
        base = 0 if train else self.ds.index.train_size
        for rows in step_plan(len(self.ds.index.rows(split)), self.rank, self.world,
                              self.per_rank, split, epoch, self.seed):
            wanted = (rows + base).tolist()
            images, kept = self._decode(train, wanted)
            labels = torch.from_numpy(self.ds.index.labels[kept].astype(np.int64))
            lost = sorted(set(wanted) - set(kept))
            example = f"{self.ds.index.path(lost[0])}: DALI cannot read or decode it" if lost else ""
            yield (images.to(self.device, non_blocking=True),
                   labels.to(self.device, non_blocking=True), len(wanted) - len(kept), example)

    def close(self) -> None:
        self._pipes.clear()
        self._probe = None


class DaliImageFolderDataset(ImageFolderDataset):
    """The same folders decoded by NVIDIA DALI: on the GPU (nvJPEG) when the rank has one,
    else with DALI's CPU decoders."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 index_dir: Path | str | None = None) -> None:
        if not dali_available():
            raise DataError("gpu_decode needs NVIDIA DALI: pip install 'automlperf[dali]' "
                            "(or set data.gpu_decode = false)")
        super().__init__(root, image_size, workers, "imagenet", index_dir)

    def _new_loader(self, rank: int, world: int, per_rank: int, seed: int,
                    device: torch.device) -> Any:
        return _DaliLoader(self, rank, world, per_rank, seed, device)




def load(dataset: str, data_dir: Path | str | None = None, image_size: int | None = None,
         workers: int = 4, gpu_decode: bool | None = _DATA.gpu_decode,
         synthetic_images: int = _DATA.synthetic_images,
         synthetic_classes: int = _DATA.synthetic_classes, index_dir: str | None = None,
         max_unreadable: float = _DATA.max_unreadable, device_type: str = "cpu") -> Dataset:
    """A dataset by name (see :func:`_load`), allowed ``max_unreadable`` of its images
    unreadable per split and epoch."""
    data = _load(dataset, data_dir, image_size, workers, gpu_decode, synthetic_images,
                 synthetic_classes, index_dir, device_type)
    data.max_unreadable = max_unreadable
    return data


def _load(dataset: str, data_dir: Path | str | None, image_size: int | None, workers: int,
          gpu_decode: bool | None, synthetic_images: int, synthetic_classes: int,
          index_dir: str | None, device_type: str) -> Dataset:
    """A dataset by name; raises DataError naming what is missing. Image folders are decoded
    by DALI when ``gpu_decode`` is set, or unset with DALI installed and a GPU
    (``device_type``) to train on."""
    if dataset == "builtin":
        return builtin(image_size or 12)
    if dataset == "digits":
        return digits(image_size or 8)
    if dataset == "cifar10":
        return cifar10(data_dir, image_size or 32)
    if dataset == "imagenet":
        if gpu_decode is None:
            gpu_decode = device_type == "cuda" and dali_available()
        cls = DaliImageFolderDataset if gpu_decode else ImageFolderDataset
        return cls(data_dir, image_size or 224, workers, index_dir=index_dir)
    if dataset == "synthetic":
        return SyntheticDataset(image_size or 224, synthetic_classes, synthetic_images)
    raise DataError(f"unknown dataset {dataset!r}; choose imagenet, cifar10, builtin, digits "
                    "or synthetic")
