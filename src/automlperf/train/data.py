"""Datasets behind one interface: each yields normalised (images, labels) batches on a device,
sharded across data-parallel ranks, and counts the images it actually delivered.

* ``builtin``: the MNIST sample shipped with the package (5,000 images, 10 classes).
* ``digits``: the small handwritten digits shipped with the package (1,797 images of 8x8).
* ``cifar10``: the CIFAR-10 binary or python batches from a local folder (read as data; the
  python batches go through an unpickler that only admits NumPy arrays).
* ``imagenet``: ``train/<class>/*.JPEG`` and ``val/<class>/*.JPEG``, decoded by worker
  processes (or on the GPU with NVIDIA DALI), random-resized-crop + flip for training,
  resize + centre crop for validation.
* ``synthetic``: random tensors made on the device, for throughput only.

Unreadable images are skipped and counted, never fatal.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import io
import math
import os
import pickle
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.config import DataConfig
from automlperf.errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png", ".bmp", ".webp"}


class DataError(UserError, ValueError):
    """A dataset that is missing or malformed; the message says what to fix."""


class Dataset(ABC):
    """Shards and batches of one dataset; ``skipped`` counts unreadable images so far."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    train_size: int
    val_size: int
    official: bool = False

    def __init__(self) -> None:
        self.skipped = 0

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    @abstractmethod
    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of this rank's shard (see :func:`shard`)."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "classes": self.num_classes, "image_size": self.image_size,
                "channels": self.channels, "train_images": self.train_size,
                "val_images": self.val_size, "official": self.official}


def shard(n: int, rank: int, world: int, split: str, epoch: int, seed: int) -> torch.Tensor:
    """This rank's images: every image once per epoch over all ranks (shard sizes differ by
    at most one), training order reshuffled each epoch."""
    if split == "train":
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=gen)[rank::world]
    return torch.arange(rank, n, world)


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
        idx = shard(len(y_all), rank, world, split, epoch, seed).to(device)
        gen = torch.Generator(device=device).manual_seed(seed * 7919 + epoch * 31 + rank)
        for start in range(0, len(idx), batch_size):
            sel = idx[start:start + batch_size]
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
        n = len(shard(self.train_size if split == "train" else self.val_size, rank, world,
                      split, epoch, seed))
        gen = torch.Generator(device=device).manual_seed(seed + epoch * 31 + rank)
        shape = (min(batch_size, n), *self.input_shape)
        x = torch.randn(shape, generator=gen, device=device)
        for start in range(0, n, batch_size):
            size = min(batch_size, n - start)
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


class _FolderItems(torch.utils.data.Dataset):
    """Decodes one image in a worker process; returns None for an unreadable file."""

    def __init__(self, items: list[tuple[str, int]], train: bool, size: int, seed: int) -> None:
        self.items, self.train, self.size, self.seed = items, train, size, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int] | None:
        from PIL import Image, UnidentifiedImageError

        path, label = self.items[i]
        bilinear = Image.Resampling.BILINEAR
        try:
            with Image.open(path) as file:
                img = file.convert("RGB")
                if self.train:
                    rng = random.Random(hash((self.seed, self.epoch, i)))
                    box = random_resized_crop_box(img.width, img.height, rng)
                    img = img.resize((self.size, self.size), bilinear, box=box)
                    if rng.random() < 0.5:
                        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                else:
                    short = round(self.size / 0.875)  # 256 for 224
                    scale = short / min(img.width, img.height)
                    img = img.resize((max(short, round(img.width * scale)),
                                      max(short, round(img.height * scale))), bilinear)
                    left = (img.width - self.size) // 2
                    top = (img.height - self.size) // 2
                    img = img.crop((left, top, left + self.size, top + self.size))
                array = np.asarray(img, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError):
            return None
        return torch.from_numpy(array.copy()).permute(2, 0, 1), label


def _collate(batch: list[Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
    good = [b for b in batch if b is not None]
    if not good:
        return torch.empty(0, 3, 1, 1, dtype=torch.uint8), torch.empty(0, dtype=torch.long), len(batch)
    # default_collate stacks straight into shared memory inside a worker, which saves a copy
    # of every batch on its way to the rank.
    x, y = torch.utils.data.default_collate(good)
    return x, y, len(batch) - len(good)


def _worker_init(rank_pid: int, _worker_id: int) -> None:
    """A data-loading worker dies with its rank, even when the rank is killed outright."""
    from automlperf.procutil import die_with_parent

    die_with_parent(rank_pid)


class _ShardSampler(torch.utils.data.Sampler[int]):
    def __init__(self, indices: torch.Tensor) -> None:
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def __len__(self) -> int:
        return len(self.indices)


class ImageFolderDataset(Dataset):
    """ImageNet-style folders decoded by DataLoader worker processes."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 name: str = "imagenet") -> None:
        super().__init__()
        if root is None:
            raise DataError("imagenet needs --data-dir: a folder with train/<class>/*.JPEG and "
                            "val/<class>/*.JPEG")
        self.root = Path(root)
        self.classes, self._items = scan_image_folder(self.root)
        self.name, self.num_classes, self.channels = name, len(self.classes), 3
        self.image_size, self.workers = image_size, workers
        self.train_size, self.val_size = len(self._items["train"]), len(self._items["val"])
        self.official = name == "imagenet" and len(self.classes) == 1000
        self._mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
        self._std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        items = _FolderItems(self._items[split], split == "train", self.image_size, seed)
        items.epoch = epoch
        loader = torch.utils.data.DataLoader(
            items, batch_size=batch_size,
            sampler=_ShardSampler(shard(len(items), rank, world, split, epoch, seed)),
            num_workers=self.workers, collate_fn=_collate, pin_memory=device.type == "cuda",
            prefetch_factor=4 if self.workers else None,
            persistent_workers=False, multiprocessing_context="fork" if self.workers else None,
            worker_init_fn=functools.partial(_worker_init, os.getpid()) if self.workers else None)
        mean, std = self._mean.to(device), self._std.to(device)
        for x, y, bad in loader:
            self.skipped += bad
            if len(y):
                x = x.to(device, non_blocking=True).float()
                yield (x - mean) / std, y.to(device, non_blocking=True)


class DaliImageFolderDataset(ImageFolderDataset):
    """The same folders decoded on the GPU by NVIDIA DALI (``gpu_decode = true``)."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4) -> None:
        super().__init__(root, image_size, workers)
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            raise DataError("gpu_decode needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
                            "(or set data.gpu_decode = false)") from None

    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        idx = shard(len(self._items[split]), rank, world, split, epoch, seed).tolist()
        files = [self._items[split][i][0] for i in idx]
        labels = [self._items[split][i][1] for i in idx]
        train, size = split == "train", self.image_size

        @pipeline_def(batch_size=batch_size, num_threads=max(1, self.workers),
                      device_id=device.index or 0, seed=seed + epoch)
        def pipe():
            jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=False,
                                         name="reader")
            if train:
                images = fn.decoders.image_random_crop(jpegs, device="mixed",
                                                       output_type=types.RGB)
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=round(size / 0.875))
                mirror = False
            images = fn.crop_mirror_normalize(
                images, crop=(size, size), mirror=mirror, dtype=types.FLOAT,
                output_layout="CHW", mean=[m * 255 for m in IMAGENET_MEAN],
                std=[s * 255 for s in IMAGENET_STD])
            return images, lab.gpu()

        p = pipe()
        p.build()
        for out in DALIGenericIterator([p], ["x", "y"], reader_name="reader",
                                       last_batch_policy=LastBatchPolicy.PARTIAL):
            yield out[0]["x"], out[0]["y"].view(-1).long()


_DATA = DataConfig()  # the one source of the data defaults


def load(dataset: str, data_dir: Path | str | None = None, image_size: int | None = None,
         workers: int = 4, gpu_decode: bool = _DATA.gpu_decode,
         synthetic_images: int = _DATA.synthetic_images,
         synthetic_classes: int = _DATA.synthetic_classes) -> Dataset:
    """A dataset by name; raises DataError naming what is missing."""
    if dataset == "builtin":
        return builtin(image_size or 12)
    if dataset == "digits":
        return digits(image_size or 8)
    if dataset == "cifar10":
        return cifar10(data_dir, image_size or 32)
    if dataset == "imagenet":
        cls = DaliImageFolderDataset if gpu_decode else ImageFolderDataset
        return cls(data_dir, image_size or 224, workers)
    if dataset == "synthetic":
        return SyntheticDataset(image_size or 224, synthetic_classes, synthetic_images)
    raise DataError(f"unknown dataset {dataset!r}; choose imagenet, cifar10, builtin, digits "
                    "or synthetic")
