"""A folder staged on a node, file by file (runner/staging.py stages the official archives,
three large files): the files of the run's index (saved at submission) copied with threads
to the node's storage and checked (every file there with its size, and a sample of their
contents against the originals). For unofficial runs on folders: at hundreds of nodes its
millions of file operations are the shared file system's problem."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from automlperf.dataset.index import FileIndex, read_index_meta
from automlperf.dataset.shared import SHARED_INDEX, node_name
from automlperf.errors import UserError

SAMPLE = 500  # files whose content is compared with the originals
HEADROOM = 1.02  # the file system's own blocks beside the files' bytes


class StagingError(UserError, RuntimeError):
    """The data could not be staged on this node; the message says what to do."""


def _index(run_dir: Path) -> tuple[FileIndex, dict[str, Any]]:
    folder = Path(run_dir) / SHARED_INDEX
    if not (folder / FileIndex.META).exists():
        raise StagingError(f"{run_dir} has no dataset index to stage from: write the job with "
                           "`automlperf slurm --data-dir DIR`, which saves it")
    return FileIndex.load(folder), read_index_meta(folder)


def stage_folder(run_dir: Path, target: Path, local: Path, threads: int = 16,
                 seed: int | None = None) -> dict[str, Any]:
    """Copy the run's folder to ``target`` under ``local`` on this node and check it; what
    the node's record holds. A copy already there (a resubmitted job) is checked and kept,
    not copied again."""
    started = time.perf_counter()
    index, meta = _index(run_dir)
    source = Path(index.root)
    if not source.is_dir():
        raise StagingError(f"{source} is not readable on {node_name()}: staging reads the "
                           "dataset from the shared file system once")
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
    return {"kind": "folder", "node": node_name(), "host": socket.gethostname(),
            "root": str(target), "source": str(source), "files": len(rels), "bytes": need,
            "copied_bytes": copied, "sample": sample, "copy_s": round(copy_s, 3),
            "staging_s": round(time.perf_counter() - started, 3), "at": time.time()}


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
