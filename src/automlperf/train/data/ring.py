"""Decoding workers that write each image straight into its place in a ring of batch slots.

The slots (images, labels and the rows they hold) live in shared memory made before the
workers are forked, so a worker's output needs no hand-over: the rank posts small tasks
``(ticket, slot, start, stop, train, epoch)`` to one queue that every worker takes from (the
first idle worker decodes the next chunk: no worker waits for a slower one's turn), and each
worker answers with a few numbers (its id, the chunk's seconds, its unreadable files). No
tensor, no file descriptor and no copy crosses between the processes.

An unreadable file leaves label -1 at its place; the rank leaves those places out. Tasks of a
ticket below :attr:`DecodePool.cancelled_below` are answered without decoding, so work planned
ahead for a pass that does not come is dropped quickly.
"""

from __future__ import annotations

import errno
import mmap
import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import connection
from typing import Any

import numpy as np

from automlperf.train.data.base import DataError
from automlperf.dataset.reader import Reader
from automlperf.train.data.transform import decode_file

SHM_DIR = "/dev/shm"
UNREADABLE = -1  # the label of a place whose file could not be decoded

# (ticket, slot, start, stop, train, epoch), or None to stop a worker.
Task = tuple[int, int, int, int, bool, int]


@dataclass(frozen=True)
class Done:
    """A worker's answer to one task."""

    ticket: int
    start: int
    worker: int
    seconds: float  # wall-clock seconds decoding the chunk
    cpu_seconds: float  # the worker's CPU time for it
    images: int
    bad: int
    example: str  # the last unreadable file of the chunk and why, or ""
    skipped: bool = False  # cancelled: nothing decoded
    error: str = ""  # the worker failed (not a file: a bug, memory): why


def shared_bytes(nbytes: int, where: str = SHM_DIR) -> mmap.mmap:
    """``nbytes`` of memory that processes forked afterwards share: a file in ``where``
    (``/dev/shm``, so it counts against what that holds), unlinked at once and reserved in
    full, so a full ``/dev/shm`` is a one-line error here rather than a bus error in a worker
    touching a page the file system cannot give. Anonymous shared memory where ``where`` is
    missing."""
    size = max(1, nbytes)
    try:
        fd, path = tempfile.mkstemp(prefix="automlperf-ring-", dir=where)
    except (FileNotFoundError, NotADirectoryError):
        return mmap.mmap(-1, size)
    try:
        os.unlink(path)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DataError(f"{where} cannot hold the loader's {size / 2**20:.1f} MiB of "
                                f"batch slots: enlarge {where} (a container's --shm-size) or "
                                "set data.workers = 0") from None
            os.ftruncate(fd, size)  # a file system without fallocate
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class Ring:
    """``slots`` batch slots of ``capacity`` images of ``size`` px (NHWC uint8), their labels
    and the rows of the file index they hold; in shared memory when ``shared``."""

    def __init__(self, slots: int, capacity: int, size: int, shared: bool) -> None:
        self.slots, self.capacity, self.size = slots, capacity, size
        image = size * size * 3
        self.nbytes = slots * capacity * (image + 16)
        self.buffer: Any = shared_bytes(self.nbytes) if shared else bytearray(self.nbytes)
        pixels = slots * capacity * image
        self.images = np.ndarray((slots, capacity, size, size, 3), np.uint8, self.buffer, 0)
        self.labels = np.ndarray((slots, capacity), np.int64, self.buffer, pixels)
        self.rows = np.ndarray((slots, capacity), np.int64, self.buffer, pixels + slots * capacity * 8)

    def close(self) -> None:
        # Views first: an mmap with exported buffers cannot be closed.
        del self.images, self.labels, self.rows
        if isinstance(self.buffer, mmap.mmap):
            self.buffer.close()


def decode_chunk(ring: Ring, reader: Reader, seed: int, task: Task, worker: int) -> Done:
    """Decode the task's places of its slot (in a worker, or in the rank without workers),
    each image's bytes read through ``reader`` (its file, or its place in an archive)."""
    ticket, slot, start, stop, train, epoch = task
    began, cpu = time.perf_counter(), time.process_time()
    bad, example = 0, ""
    labels = reader.index.labels
    for pos in range(start, stop):
        row = int(ring.rows[slot, pos])
        try:
            source = reader.image(row)
        except OSError as exc:
            error: str | None = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        else:
            error = decode_file(source, ring.size, train, seed, epoch, row, ring.images[slot, pos])
        if error is None:
            ring.labels[slot, pos] = int(labels[row])
        else:
            ring.labels[slot, pos] = UNREADABLE
            bad += 1
            name = reader.name(row)
            example = f"{name}: {error.replace(' ' + repr(name), '')}"
    return Done(ticket, start, worker, time.perf_counter() - began, time.process_time() - cpu,
                stop - start, bad, example)


# What a worker does with one task: decode_chunk here, the GPU path's host stage in gpuring.py.
Job = Callable[[Any, Reader, int, Task, int], Done]


def _work(ring: Any, reader: Reader, seed: int, tasks: Any, results: Any, cancel: Any,
          worker: int, rank_pid: int, job: Job = decode_chunk) -> None:
    """A worker's life: take tasks until told to stop. It dies with its rank, even when the
    rank is killed outright, and ignores SIGTERM, as its rank does: a batch system signals
    every process of a step, and a worker dying of it would fail the trial under a shutdown
    the replica runs in order."""
    from automlperf.procutil import die_with_parent

    die_with_parent(rank_pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        task = tasks.get()
        if task is None:
            return
        ticket, _, start, stop = task[:4]
        if ticket < cancel.value:
            results.put(Done(ticket, start, worker, 0.0, 0.0, 0, 0, "", skipped=True))
            continue
        try:
            done = job(ring, reader, seed, task, worker)
        except Exception as exc:  # noqa: BLE001 - reported to the rank, which fails the trial
            where = traceback.extract_tb(exc.__traceback__)[-1]
            done = Done(ticket, start, worker, 0.0, 0.0, 0, 0, "",
                        error=f"{type(exc).__name__}: {exc} ({os.path.basename(where.filename)}:"
                              f"{where.lineno})")
        results.put(done)


@dataclass
class WorkerStats:
    """What one worker did: chunks, images and seconds spent decoding them."""

    chunks: int = 0
    images: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    chunk_seconds: list[float] = field(default_factory=list)

    def add(self, done: Done) -> None:
        self.chunks += 1
        self.images += done.images
        self.seconds += done.seconds
        self.cpu_seconds += done.cpu_seconds
        if len(self.chunk_seconds) < 100_000:
            self.chunk_seconds.append(done.seconds)


class WorkerDied(RuntimeError):
    """A decoding worker ended without being told to."""


class DecodePool:
    """``workers`` processes forked now, sharing ``ring`` and ``reader`` (an archive's
    descriptor with it), taking tasks from one queue and doing ``job`` with each (decoding a
    chunk, by default); they die with the process that made them."""

    def __init__(self, ring: Any, reader: Reader, seed: int, workers: int,
                 job: Job = decode_chunk) -> None:
        ctx = mp.get_context("fork")
        self.tasks: Any = ctx.SimpleQueue()
        self.results: Any = ctx.SimpleQueue()
        self._cancel: Any = ctx.Value("q", 0, lock=False)
        self.procs = [ctx.Process(target=_work, name=f"automlperf-decode{i}", daemon=True,
                                  args=(ring, reader, seed, self.tasks, self.results,
                                        self._cancel, i, os.getpid(), job))
                      for i in range(workers)]
        for proc in self.procs:
            proc.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    @property
    def cancelled_below(self) -> int:
        return int(self._cancel.value)

    @cancelled_below.setter
    def cancelled_below(self, ticket: int) -> None:
        self._cancel.value = ticket

    def post(self, task: Task) -> None:
        self.tasks.put(task)

    def receive(self, timeout: float = 1.0) -> Done | None:
        """The next answer, or None after ``timeout`` seconds; raises :class:`WorkerDied`
        as soon as a worker has ended (killed by the system, out of memory) or failed.

        The workers' sentinels are waited on too: a worker killed while idle leaves no task
        unanswered, and the others would go on without it, so nothing would ever stall. A
        sentinel is ready once its worker is gone, even where another waiter collected its
        status (its exit code then reads None)."""
        ready = connection.wait([self.results._reader, *(p.sentinel for p in self.procs)],
                                timeout)
        for proc in self.procs:
            if proc.sentinel in ready:
                proc.join(1.0)  # its sentinel closes just before its exit code can be read
                raise WorkerDied(f"decoding worker {proc.name} (pid {proc.pid}) exited "
                                 f"with code {proc.exitcode}")
        if not ready:
            return None
        done: Done = self.results.get()
        if done.error:
            raise WorkerDied(f"decoding worker {done.worker} failed: {done.error}")
        return done

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers: asked first (what they have queued is dropped), then killed
        (they ignore SIGTERM, so terminate() cannot end one that did not stop, and
        multiprocessing would wait for it forever at exit)."""
        self.cancelled_below = 2**62
        # One that ended untold may have died holding the task queue's lock: the others
        # could then never take their stop, and asking them would only wait `timeout` out.
        ask = all(proc.is_alive() for proc in self.procs)
        if ask:
            for _ in self.procs:
                self.tasks.put(None)
        deadline = time.monotonic() + (timeout if ask else 0.0)
        while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            # Their answers to dropped tasks must not fill the pipe they wait to write to.
            while self.results._reader.poll(0.02):
                self.results.get()
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout)
        for queue in (self.tasks, self.results):
            queue.close()
        self.procs = []
