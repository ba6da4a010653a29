"""One rank's image-folder loader for one trial: its decoding workers start once and serve
every training and validation pass, writing each image into its place in a ring of batch
slots (train/data/ring.py); the rank hands finished slots to its device
(train/data/handoff.py).

Batches are planned in the order they will be asked for: this pass's, then the pass that
usually follows it (validation after a training epoch, the next epoch after validation), so
the workers decode the next pass's first batches while this one drains. A pass asked for out
of that order drops what was planned ahead. Whatever order the workers finish chunks in,
every image lands at its fixed place: the batches, and the images in them, are the step
plan's, as with one worker.

The loader keeps count of what it waited for: ``data_wait_s`` (for its workers, or decoding
itself without them) and ``device_wait_s`` (for a slot's copy to the device to finish), and
of what each worker did (:class:`LoaderStats`).
"""

from __future__ import annotations

import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from automlperf.train.data.base import step_plan
from automlperf.train.data.handoff import HostHandoff, handoff_for
from automlperf.train.data.ring import (UNREADABLE, DecodePool, Done, Ring, Task, WorkerStats,
                                        decode_chunk)

if TYPE_CHECKING:
    from automlperf.train.data.folders import ImageFolderDataset, LoaderPlan

PassKey = tuple[str, int]  # (split, epoch)
# Chunks posted and not yet answered, at most: their answers wait in a pipe (64 KiB on Linux)
# until the rank reads them, and a worker that cannot write its answer stops.
MAX_OUTSTANDING = 192


@dataclass
class _Batch:
    key: PassKey
    step: int
    rows: np.ndarray
    slot: int | None = None
    ticket: int = -1
    pending: set[int] = field(default_factory=set)  # starts of chunks not decoded yet
    bad: int = 0
    examples: dict[int, str] = field(default_factory=dict)  # by chunk start


@dataclass
class LoaderStats:
    """What a loader did since it started: images and batches delivered, seconds the rank
    waited for data and for the device, and each worker's chunks."""

    workers: list[WorkerStats]
    images: int = 0
    batches: int = 0
    data_wait_s: float = 0.0
    device_wait_s: float = 0.0
    dropped_chunks: int = 0  # planned ahead for a pass that did not come

    def summary(self) -> dict[str, Any]:
        """Plain figures: per worker images, busy seconds and its own decoding rate, and the
        spread of chunk times (the slowest worker's rate over the fastest's)."""
        busy = [w for w in self.workers if w.seconds > 0]
        rates = [w.images / w.seconds for w in busy]
        chunks = sorted(s for w in self.workers for s in w.chunk_seconds)
        return {
            "images": self.images, "batches": self.batches,
            "data_wait_s": self.data_wait_s, "device_wait_s": self.device_wait_s,
            "dropped_chunks": self.dropped_chunks,
            "worker_images": [w.images for w in self.workers],
            "worker_busy_s": [w.seconds for w in self.workers],
            "worker_cpu_s": [w.cpu_seconds for w in self.workers],
            # What the workers decode per second while decoding, summed: the rate the loader
            # would deliver if no worker ever waited.
            "decode_img_s": sum(rates),
            "worker_rate_spread": (min(rates) / max(rates)) if rates else None,
            "chunk_s_median": chunks[len(chunks) // 2] if chunks else None,
            "chunk_s_p95": chunks[int(0.95 * (len(chunks) - 1))] if chunks else None,
        }


_open_loaders: weakref.WeakSet[FolderLoader] = weakref.WeakSet()


def close_open_loaders() -> None:
    """End the workers of every loader still open (at exit: registered after
    multiprocessing's own handler, so it runs first)."""
    for loader in list(_open_loaders):
        loader.close()


class FolderLoader:
    """One rank's loader for one trial (see the module's description)."""

    def __init__(self, ds: ImageFolderDataset, rank: int, world: int, per_rank: int, seed: int,
                 device: torch.device, plan: LoaderPlan) -> None:
        self.ds, self.rank, self.world, self.per_rank = ds, rank, world, per_rank
        self.seed, self.device, self.plan = seed, device, plan
        workers = ds.workers
        self.ring = self._make_ring(per_rank + 2, shared=workers > 0)
        self.pool = DecodePool(self.ring, ds.reader, seed, workers, self.job) if workers else None
        self.handoff = self._make_handoff()  # page-locks after the fork
        self.stats = LoaderStats([WorkerStats() for _ in range(max(1, workers))])
        self._queue: deque[_Batch] = deque()  # in the order they will be asked for
        self._unslotted: deque[_Batch] = deque()  # the tail of the queue without a slot
        self._free: deque[int] = deque(range(plan.slots))
        self._by_ticket: dict[int, _Batch] = {}
        self._draining: dict[int, list[int]] = {}  # dropped ticket -> [slot, chunks to come]
        self._tickets = 0
        self._outstanding = 0
        self._last_train: int | None = None
        self._expect: PassKey | None | bool = True  # True: the usual order
        _open_loaders.add(self)

    # What a worker does with a chunk of a batch; the GPU path's loader puts its host stage here.
    job: Callable[[Any, Any, int, Task, int], Done] = staticmethod(decode_chunk)

    def _make_ring(self, capacity: int, shared: bool) -> Any:
        return Ring(self.plan.slots, capacity, self.ds.image_size, shared)

    def _make_handoff(self) -> HostHandoff:
        return handoff_for(self.ring, self.device)

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.world, self.per_rank, self.seed, self.device)

    # planning ------------------------------------------------------------------------------
    def expect(self, after: PassKey | None) -> None:
        """Say which pass comes after the one being read (None: none), instead of the usual
        order; holds for one pass."""
        self._expect = after

    def drop_ahead(self) -> None:
        """Between passes: forget the pass planned ahead, which will not come."""
        self._drop_all()
        self._expect = True

    def _following(self, key: PassKey) -> PassKey | None:
        if self._expect is not True:
            following, self._expect = self._expect, True
            return following  # type: ignore[return-value]
        if key[0] == "train":
            return ("val", 0)
        return None if self._last_train is None else ("train", self._last_train + 1)

    def _plan(self, key: PassKey) -> list[_Batch]:
        split, epoch = key
        base = 0 if split == "train" else self.ds.index.train_size
        steps = step_plan(len(self.ds.index.rows(split)), self.rank, self.world, self.per_rank,
                          split, epoch, self.seed)
        return [_Batch(key, i, (rows + base).numpy()) for i, rows in enumerate(steps)]

    def _enqueue(self, batches: list[_Batch]) -> None:
        self._queue.extend(batches)
        self._unslotted.extend(batches)

    def _drop_all(self) -> None:
        """Forget every planned batch; slots still being written are freed once their
        workers answer (tasks not begun are answered at once)."""
        if self.pool is not None:
            self.pool.cancelled_below = self._tickets
        for batch in self._queue:
            if batch.slot is None:
                continue
            self._by_ticket.pop(batch.ticket, None)
            if batch.pending and self.pool is not None:
                self._draining[batch.ticket] = [batch.slot, len(batch.pending)]
                self.stats.dropped_chunks += len(batch.pending)
            else:
                self._free.extend(self.handoff.release(batch.slot))
        self._queue.clear()
        self._unslotted.clear()

    def _fill(self) -> None:
        """Give free slots to the next batches without one and post their chunks."""
        self._free.extend(self.handoff.reclaim())
        chunk = self.plan.chunk
        while self._free and self._unslotted:
            tasks = math.ceil(len(self._unslotted[0].rows) / chunk)
            if self.pool is not None and self._outstanding and \
                    self._outstanding + tasks > MAX_OUTSTANDING:
                break
            batch = self._unslotted.popleft()
            slot = self._free.popleft()
            n = len(batch.rows)
            self.ring.rows[slot, :n] = batch.rows
            batch.slot, batch.ticket = slot, self._tickets
            self._tickets += 1
            batch.pending = set(range(0, n, chunk))
            self._by_ticket[batch.ticket] = batch
            if self.pool is not None:
                train = batch.key[0] == "train"
                self._outstanding += len(batch.pending)
                for start in sorted(batch.pending):
                    self.pool.post((batch.ticket, slot, start, min(n, start + chunk), train,
                                    batch.key[1]))

    # receiving -----------------------------------------------------------------------------
    def _record(self, done: Done) -> None:
        if self.pool is not None:
            self._outstanding -= 1
        if not done.skipped:
            self.stats.workers[done.worker].add(done)
        batch = self._by_ticket.get(done.ticket)
        if batch is None:
            draining = self._draining.get(done.ticket)
            if draining is not None:
                draining[1] -= 1
                if draining[1] == 0:
                    del self._draining[done.ticket]
                    self._free.append(draining[0])
            return
        batch.pending.discard(done.start)
        batch.bad += done.bad
        if done.example:
            batch.examples[done.start] = done.example

    def _decode_here(self, batch: _Batch) -> None:
        """Without workers, the rank decodes the batch itself."""
        assert batch.slot is not None
        n, chunk = len(batch.rows), self.plan.chunk
        for start in sorted(batch.pending):
            task = (batch.ticket, batch.slot, start, min(n, start + chunk),
                    batch.key[0] == "train", batch.key[1])
            self._record(self.job(self.ring, self.ds.reader, self.seed, task, 0))

    def _wait(self, batch: _Batch) -> None:
        """Until ``batch`` is decoded; waits for a slot's copy are waits for the device."""
        while batch.slot is None or batch.pending:
            self._fill()
            if batch.slot is None and not self._draining and self.handoff.busy:
                began = time.perf_counter()
                self._free.extend(self.handoff.wait_oldest())
                waited = time.perf_counter() - began
                self.stats.device_wait_s += waited
                self.ds.device_wait_s += waited
                continue
            if batch.slot is not None and not batch.pending:
                break
            if self.pool is None:
                began = time.perf_counter()
                self._decode_here(batch)
                self.stats.data_wait_s += time.perf_counter() - began
                continue
            began = time.perf_counter()
            done = self.pool.receive(1.0)
            self.stats.data_wait_s += time.perf_counter() - began
            if done is not None:
                self._record(done)

    # the passes ----------------------------------------------------------------------------
    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step. On a CPU the images are a view of the ring, valid until the
        next batch is asked for."""
        key: PassKey = (split, epoch)
        head = self._queue[0] if self._queue else None
        if head is None or head.key != key or head.step != 0:
            self._drop_all()
            self._enqueue(self._plan(key))
        if split == "train":
            self._last_train = epoch
        following = self._following(key)
        if following is not None and following != key:
            self._enqueue(self._plan(following))
        self._fill()
        while self._queue and self._queue[0].key == key:
            batch = self._queue[0]
            self._wait(batch)
            assert batch.slot is not None
            n = len(batch.rows)
            keep = None
            if batch.bad:
                keep = np.flatnonzero(self.ring.labels[batch.slot, :n] != UNREADABLE)
            images, labels = self.handoff.deliver(batch.slot, n, keep)
            example = next((batch.examples[s] for s in sorted(batch.examples)), "")
            self.stats.images += len(labels)
            self.stats.batches += 1
            yield images, labels, batch.bad, example
            self._queue.popleft()
            self._by_ticket.pop(batch.ticket, None)
            self._free.extend(self.handoff.release(batch.slot))
            self._fill()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.handoff.close()
        try:
            self.ring.close()
        except BufferError:
            pass  # a batch is still in use: the memory goes with it
        self._queue.clear()
        self._unslotted.clear()
        self._by_ticket.clear()
        _open_loaders.discard(self)
