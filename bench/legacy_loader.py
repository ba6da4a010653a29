"""The image-folder loader as it was before the persistent, chunked pipeline, kept verbatim
so the pipeline benchmark can run the old and the new loader side by side in one run:
a new DataLoader (new worker processes) for every pass, one worker decoding a whole
per-rank batch at full resolution, ``prefetch_factor=4`` batches per worker, CHW output."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from automlperf.train.data import IMAGENET_MEAN, IMAGENET_STD, random_resized_crop_box


def shard(n: int, rank: int, world: int, split: str, epoch: int, seed: int) -> torch.Tensor:
    """This rank's images: every image once per epoch over all ranks (shard sizes differ by
    at most one), training order reshuffled each epoch."""
    if split == "train":
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=gen)[rank::world]
    return torch.arange(rank, n, world)


class _Items(torch.utils.data.Dataset):
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
                    short = round(self.size / 0.875)
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
    x, y = torch.utils.data.default_collate(good)
    return x, y, len(batch) - len(good)


class _Sampler(torch.utils.data.Sampler[int]):
    def __init__(self, indices: torch.Tensor) -> None:
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def __len__(self) -> int:
        return len(self.indices)


PREFETCH = 4


def legacy_batches(items: list[tuple[str, int]], split: str, rank: int, world: int,
                   batch_size: int, epoch: int, seed: int, size: int, workers: int,
                   device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    ds = _Items(items, split == "train", size, seed)
    ds.epoch = epoch
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch_size, sampler=_Sampler(shard(len(ds), rank, world, split, epoch, seed)),
        num_workers=workers, collate_fn=_collate, pin_memory=device.type == "cuda",
        prefetch_factor=PREFETCH if workers else None, persistent_workers=False,
        multiprocessing_context="fork" if workers else None)
    mean = (torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255).to(device)
    std = (torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255).to(device)
    for x, y, _bad in loader:
        if len(y):
            x = x.to(device, non_blocking=True).float()
            yield (x - mean) / std, y.to(device, non_blocking=True)


def legacy_memory_bound(batch: int, workers: int, size: int) -> dict[str, int]:
    """Shared and pinned bytes the old settings allow one rank: every worker may hold
    ``PREFETCH`` whole batches in shared memory, and the pinning thread copies each into
    pinned memory, which PyTorch's host allocator rounds up to a power of two."""
    batch_bytes = batch * size * size * 3
    in_flight = PREFETCH * max(1, workers)
    pinned_block = 1 << (batch_bytes - 1).bit_length()
    return {"shared_bytes": in_flight * batch_bytes, "pinned_bytes": in_flight * pinned_block}
