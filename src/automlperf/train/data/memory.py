"""Datasets held in memory: the built-in MNIST sample and digits shipped with the package,
CIFAR-10 read from its batches (as data: the python batches go through an unpickler that
only admits NumPy arrays), and synthetic tensors made on the device for throughput only."""

from __future__ import annotations

import gzip
import importlib.resources
import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.seeding import mix_seed
from automlperf.train.data.base import DataError, Dataset, step_plan


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
        gen = torch.Generator(device=device).manual_seed(mix_seed(seed, epoch, rank))
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


# Validation images per class of the built-in sample: 1,000 of its 5,000 images, so that
# validating takes about a twentieth of a replica's time, as ImageNet's 50,000 images against
# 1,281,167 take a thirtieth (3,000 of them took more than a quarter; bench/RESULTS.md).
BUILTIN_VAL_PER_CLASS = 100


def builtin(image_size: int = 12) -> TensorDataset:
    """The MNIST sample shipped with automlperf (see data/MNIST-LICENSE.txt): 4,000 training
    and 1,000 validation images (a fixed stratified split), 28x28 grey levels 0..255,
    resized to ``image_size``. Few training images at a low resolution keep a short CPU run
    below 100 % validation accuracy, so architectures can still be told apart; the
    validation images make accuracy steps of 1/1,000."""
    table = _packaged_table("mnist_5k.csv.gz", 785)
    images = torch.from_numpy(table[:, :784].astype(np.uint8)).view(-1, 1, 28, 28)
    labels = torch.from_numpy(table[:, 784])
    is_val = _stratified_split(table[:, 784], BUILTIN_VAL_PER_CLASS, 20240601)
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
