"""The image-folder loader as it was before its workers shared one queue and wrote into a ring
of batch slots (automlperf 391cf24, train/data/folders.py), kept so bench_loader.py can run the
old and the new loader side by side in one run: a persistent DataLoader whose workers take
chunks in strict rotation and deliver them in order, each chunk a fresh pair of tensors in
shared memory handed over by file descriptor, concatenated on the rank's thread (into pinned
buffers on GPUs), 16 intra-op threads on a rank if it had them.

Two additions for measuring, marked: each chunk also returns its worker's id and the seconds
it took to decode (so the workers' own rate is known in the same run), and ``decode`` can be
replaced to stub decoding out. The decoding itself is the reference's (train/data/transform.py),
pixel for pixel the old training transform."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from automlperf.train.data import step_plan
from automlperf.train.data.index import FileIndex
from automlperf.train.data.transform import decode_file

CHUNK_IMAGES = 32
MAX_PREFETCH = 4
PINNED_BATCHES = 2
SHARED_BUDGET = 512 * 2**20


def plan_loader(per_rank: int, workers: int, image_bytes: int,
                budget: int = SHARED_BUDGET, chunk: int = CHUNK_IMAGES) -> tuple[int, int]:
    """(chunk, prefetch) as the old loader planned them."""
    slots = max(1, workers)
    chunk = max(1, min(chunk, per_rank + 2, budget // (slots * image_bytes)))
    prefetch = max(1, min(MAX_PREFETCH, budget // (slots * chunk * image_bytes)))
    return chunk, prefetch


class _FolderChunks(torch.utils.data.Dataset):
    def __init__(self, index: FileIndex, size: int, seed: int,
                 decode: Callable[..., str | None] = decode_file) -> None:
        self.index, self.size, self.seed, self.decode = index, size, seed, decode

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: tuple[bool, int, tuple[int, ...]]) -> tuple[Any, ...]:
        began = time.perf_counter()  # measuring
        train, epoch, rows = key
        s = self.size
        images = torch.empty((len(rows), s, s, 3), dtype=torch.uint8)
        if torch.utils.data.get_worker_info() is not None:
            images.share_memory_()
        labels = torch.empty(len(rows), dtype=torch.long)
        pixels = images.numpy()
        n = 0
        example = ""
        for row in rows:
            path = self.index.path(row)
            error = self.decode(path, s, train, self.seed, epoch, row, pixels[n])
            if error is None:
                labels[n] = int(self.index.labels[row])
                n += 1
            else:
                example = f"{path}: {error}"
        info = torch.utils.data.get_worker_info()  # measuring
        worker = info.id if info is not None else 0
        return images[:n], labels[:n], len(rows) - n, example, worker, time.perf_counter() - began


def _no_collate(chunk: Any) -> Any:
    return chunk


def _worker_init(rank_pid: int, _worker_id: int) -> None:
    import signal

    from automlperf.procutil import die_with_parent

    die_with_parent(rank_pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _ChunkSampler(torch.utils.data.Sampler[Any]):
    def __init__(self) -> None:
        self.keys: list[tuple[bool, int, tuple[int, ...]]] = []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


class LegacyChunkLoader:
    """One rank's old loader for one trial; ``chunk_log`` collects (worker, images, seconds)
    of every chunk it received."""

    def __init__(self, index: FileIndex, size: int, workers: int, per_rank: int, seed: int,
                 device: torch.device, decode: Callable[..., str | None] = decode_file) -> None:
        self.index, self.size, self.per_rank, self.seed, self.device = (index, size, per_rank,
                                                                        seed, device)
        self.pinned = device.type == "cuda"
        self.chunk, prefetch = plan_loader(per_rank, workers, size * size * 3)
        self.sampler = _ChunkSampler()
        self.loader: Any = torch.utils.data.DataLoader(
            _FolderChunks(index, size, seed, decode), batch_size=None, sampler=self.sampler,
            collate_fn=_no_collate, num_workers=workers,
            prefetch_factor=prefetch if workers else None, persistent_workers=workers > 0,
            multiprocessing_context="fork" if workers else None,
            worker_init_fn=functools.partial(_worker_init, os.getpid()) if workers else None)
        self._buffers: list[torch.Tensor] = []
        self._copied: list[Any] = []
        self._slot = 0
        self.chunk_log: list[tuple[int, int, float]] = []

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        train = split == "train"
        base = 0 if train else self.index.train_size
        steps = step_plan(len(self.index.rows(split)), 0, 1, self.per_rank, split, epoch,
                          self.seed)
        chunk = self.chunk
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
            self.chunk_log += [(p[4], len(p[1]) + p[2], p[5]) for p in parts]  # measuring
            bad = sum(p[2] for p in parts)
            example = next((p[3] for p in parts if p[3]), "")
            labels = torch.cat([p[1] for p in parts]) if parts else torch.empty(0, dtype=torch.long)
            images = self._assemble([p[0] for p in parts], len(labels))
            yield images, labels.to(self.device, non_blocking=True), bad, example

    def _assemble(self, parts: list[torch.Tensor], n: int) -> torch.Tensor:
        s = self.size
        if not self.pinned:
            if len(parts) == 1:
                return parts[0]
            return torch.cat(parts) if parts else torch.empty((0, s, s, 3), dtype=torch.uint8)
        if not self._buffers:
            self._buffers = [torch.empty((self.per_rank + 2, s, s, 3), dtype=torch.uint8,
                                         pin_memory=True) for _ in range(PINNED_BATCHES)]
            self._copied = [None] * PINNED_BATCHES
        slot = self._slot
        self._slot = (slot + 1) % PINNED_BATCHES
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()
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
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=10)
        self.loader = None


def stub_decode(path: str, size: int, train: bool, seed: int, epoch: int, row: int,
                out: np.ndarray) -> str | None:
    """Decoding stubbed out: the pixels are written, nothing is read."""
    out[...] = row & 0xFF
    return None
