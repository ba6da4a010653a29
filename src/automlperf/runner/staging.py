"""The dataset staged on each node before the clock: ``automlperf stage``, run once per node
by the batch job (``automlperf slurm --stage-to DIR``).

Without it every node reads all of ImageNet every epoch, file by file, from the shared file
system: 30 to 40 thousand opens a second per 8-GPU node, millions at hundreds of nodes. A
staged node copies the files of the run's index (saved at submission) once, to its own
storage, checks the copy (every file there with its size, and a sample of their contents
against the originals), and records where it is in ``RUN_DIR/staging/<node>.json``; its
replica then reads the copy (runner/worker.py). The copy is kept for a resubmission of the
run on the same node, and removed with ``--clean`` at the job's end; the record stays.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from automlperf.dataset_identity import SHARED_INDEX, FileIndex, read_index_meta
from automlperf.errors import UserError
from automlperf.store.rundir import write_atomic

STAGING = "staging"
SAMPLE = 500  # files whose content is compared, as the official data proof samples
HEADROOM = 1.02  # the file system's own blocks beside the files' bytes


class StagingError(UserError, RuntimeError):
    """The data could not be staged on this node; the message says what to do."""


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def record_path(run_dir: Path, node: str | None = None) -> Path:
    return Path(run_dir) / STAGING / f"{node or node_name()}.json"


def staged_root(run_dir: Path, local: Path) -> Path:
    """Where a run's copy lives under a node's local folder: one folder per run and node
    (a folder that several nodes share, a burst buffer, then holds one copy each)."""
    return Path(local) / f"automlperf-{Path(run_dir).resolve().name}-{node_name()}"


def _index(run_dir: Path) -> tuple[FileIndex, dict[str, Any]]:
    folder = Path(run_dir) / SHARED_INDEX
    if not (folder / FileIndex.META).exists():
        raise StagingError(f"{run_dir} has no dataset index to stage from: write the job with "
                           "`automlperf slurm --data-dir DIR`, which saves it")
    return FileIndex.load(folder), read_index_meta(folder)


def stage(run_dir: Path, local: Path, threads: int = 16, seed: int | None = None) -> dict[str, Any]:
    """Copy the run's dataset to ``local`` on this node, check it, and record it; what was
    recorded. A copy already there (a resubmitted job) is checked and kept, not copied again."""
    started = time.perf_counter()
    index, meta = _index(run_dir)
    source = Path(index.root)
    if not source.is_dir():
        raise StagingError(f"{source} is not readable on {node_name()}: staging reads the "
                           "dataset from the shared file system once")
    target = staged_root(run_dir, local)
    rels = [index.relative(r) for r in range(len(index))]
    need = meta.get("bytes")
    if need is None:  # an index saved before sizes were kept
        with ThreadPoolExecutor(threads) as pool:
            need = sum(pool.map(lambda rel: os.stat(source / rel).st_size, rels))
    Path(local).mkdir(parents=True, exist_ok=True)
    have = _bytes_there(target, rels)
    free = shutil.disk_usage(local).free
    if (need - have) * HEADROOM > free:
        raise StagingError(f"{local} on {node_name()} has {free / 1e9:.2f} GB free and the "
                           f"dataset needs {(need - have) / 1e9:.2f} GB more: give "
                           "--stage-to a larger node-local folder, or run without staging")
    for folder in sorted({rel.rsplit("/", 1)[0] for rel in rels}):
        (target / folder).mkdir(parents=True, exist_ok=True)

    def copy(rel: str) -> tuple[int, int]:
        """(the original's size, the bytes copied)."""
        src, dst = source / rel, target / rel
        size = os.stat(src).st_size
        try:
            if os.stat(dst).st_size == size:
                return size, 0  # kept from an earlier staging of this run
        except FileNotFoundError:
            pass
        partial = dst.with_name(dst.name + ".part")
        shutil.copyfile(src, partial)
        os.replace(partial, dst)
        return size, size

    done: list[tuple[int, int]] = []
    with ThreadPoolExecutor(threads) as pool:
        # In slices: a million futures at once would hold gigabytes.
        for start in range(0, len(rels), 10_000):
            done.extend(pool.map(copy, rels[start:start + 10_000]))
    copied = sum(c for _, c in done)
    copy_s = time.perf_counter() - started
    sample = _check(source, target, rels, [size for size, _ in done], seed)
    record = {"node": node_name(), "host": socket.gethostname(), "root": str(target),
              "source": str(source), "files": len(rels), "bytes": need, "copied_bytes": copied,
              "sample": sample, "copy_s": round(copy_s, 3),
              "staging_s": round(time.perf_counter() - started, 3), "at": time.time()}
    path = record_path(run_dir)
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return record


def _bytes_there(target: Path, rels: list[str]) -> int:
    if not target.exists():
        return 0
    total = 0
    for rel in rels:
        try:
            total += os.stat(target / rel).st_size
        except FileNotFoundError:
            pass
    return total


def _check(source: Path, target: Path, rels: list[str], sizes: list[int],
           seed: int | None) -> int:
    """Every file of the index is in the copy with the original's size (one ``stat`` each,
    on local storage), and a sample of them has the original's content; the sample's size."""
    for rel, size in zip(rels, sizes):
        try:
            if os.stat(target / rel).st_size != size:
                raise StagingError(f"{target / rel} differs in size from {source / rel}: the "
                                   "copy is damaged (the local disk?); remove "
                                   f"{target} and stage again")
        except FileNotFoundError:
            raise StagingError(f"{target / rel} is missing after staging: remove {target} "
                               "and stage again") from None
    chosen = random.Random(seed).sample(rels, min(SAMPLE, len(rels)))
    for rel in chosen:
        if _digest(source / rel) != _digest(target / rel):
            raise StagingError(f"{target / rel} differs in content from {source / rel}: "
                               f"remove {target} and stage again")
    return len(chosen)


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def clean(run_dir: Path, local: Path) -> bool:
    """Remove this node's copy of the run's data; whether there was one. Its record stays
    in the run directory, as ``<node>-<time>.json`` (what the run read, and from where),
    where no replica takes it for a copy that is there."""
    target = staged_root(run_dir, local)
    record = record_path(run_dir)
    if record.exists():
        kept = json.loads(record.read_text())
        kept["removed_at"] = time.time()
        write_atomic(record.with_name(f"{record.stem}-{int(kept['at'])}.json"),
                     json.dumps(kept, indent=1) + "\n")
        record.unlink()
    if not target.exists():
        return False
    shutil.rmtree(target)
    return True


def local_root(run_dir: Path) -> str | None:
    """This node's staged copy of the run's data, if its record says there is one."""
    path = record_path(run_dir)
    try:
        return str(json.loads(path.read_text())["root"])
    except (FileNotFoundError, ValueError, KeyError):
        return None
