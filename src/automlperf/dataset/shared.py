"""The run's shared index: made once per session by the primary, before its clock, saved in
``RUN_DIR/dataset-index`` and read by every replica and rank instead of reading the data's
layout again.

* Archives (dataset/archive.py): the session's proof pass makes it (dataset/proof.py), every
  session again: the index is the proof's, its digest recorded with it, and every process
  that loads it holds it to that digest and the archives to their proven identities.
* A folder (dataset/folder.py): walked once (one ``stat`` per file); a later session loads
  the saved index unless a class folder changed since.

No torch here.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf import rules
from automlperf.dataset.archive import NAMES, is_archive_folder
from automlperf.dataset.folder import (DatasetScan, folder_stamps, index_folder, problems, scan,
                                       walk_splits)
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError, FileIndex, read_index_meta
from automlperf.dataset.proof import check_identity, prove
from automlperf.dataset.walk import collector_paused

SHARED_INDEX = "dataset-index"  # in the run directory


@dataclass
class SharedIndex:
    """A session's dataset: its identity as the run records it (``identity``, with its
    problems, and for archives the proof), its index, the folder they are saved in, the
    seconds the walk or the proof's pass took, and whether this process ``built`` it."""

    folder: Path
    identity: dict[str, Any]
    index: FileIndex
    scan_s: float
    built: bool


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def build_shared_index(data_dir: Path | str, run_dir: Path | str,
                       ruleset: rules.Ruleset = rules.CURRENT) -> SharedIndex:
    """Read ``data_dir`` once (the archives' proof pass, or a folder's walk) and save its
    identity and index in ``RUN_DIR/dataset-index``. Raises :class:`DatasetIdentityError`
    for data that training cannot use."""
    root = Path(data_dir)
    started = time.perf_counter()
    extra: dict[str, Any] = {}
    if is_archive_folder(root):
        found, identity = prove(root, ruleset)
        assert found.index is not None
        index = found.index
    else:
        with collector_paused():
            listing = walk_splits(root)
            seen = scan(root, listing)
            index = index_folder(root, listing)
        identity = {**seen.summary(), "problems": problems(seen, ruleset.dataset)}
        extra = {"found": seen.to_dict(), "stamps": folder_stamps(root, index.classes),
                 "bytes": sum(size for _, size in listing)}
    took = time.perf_counter() - started
    folder = Path(run_dir) / SHARED_INDEX
    index.save(folder, identity=identity, digest=index.digest(), scan_s=round(took, 3),
               scanned_at=time.time(), host=socket.gethostname(), **extra)
    return SharedIndex(folder, identity, index, took, built=True)


def load_shared_index(run_dir: Path | str, data_dir: Path | str | None = None,
                      ruleset: rules.Ruleset = rules.CURRENT) -> SharedIndex | None:
    """A folder's index that an earlier step saved in the run directory, its paths under
    ``data_dir`` (default: where it was walked), while no class folder changed since (a file
    added, removed or renamed changes its folder's time: one ``stat`` per class folder).
    None otherwise, and always for archives: each session proves them again."""
    folder = Path(run_dir) / SHARED_INDEX
    if not (folder / FileIndex.META).exists():
        return None
    meta = read_index_meta(folder)
    if meta.get("source") == ARCHIVES:
        return None
    root = Path(data_dir or meta["root"])
    try:
        if folder_stamps(root, meta["classes"]) != meta["stamps"]:
            return None
    except OSError:
        return None
    seen = DatasetScan(**meta["found"])
    identity = {**seen.summary(), "problems": problems(seen, ruleset.dataset)}
    return SharedIndex(folder, identity, FileIndex.load(folder, root), meta["scan_s"], built=False)


def check_data_here(index_dir: Path | str, data_dir: Path | str,
                    digest: str | None = None) -> FileIndex:
    """The run's saved index with its names under this node's ``data_dir``, once the data
    is seen to be here: a folder's split folders and the first and last image of each split
    exist (a handful of ``stat`` calls, where walking the folder would be a million); each
    archive is the file the run proved (its identity). With ``digest``, the index is the
    one the run proved. A node without the data raises :class:`DatasetIdentityError`
    naming what it lacks."""
    node = node_name()
    index = FileIndex.load(index_dir, data_dir)
    if digest is not None and index.digest() != digest:
        raise DatasetIdentityError(f"{index_dir} is not the index this session proved (its "
                                   "digest differs): it was written since; resume the run")
    if index.source == ARCHIVES:
        for split, name in index.archives.items():
            archive = Path(index.root) / name
            if not archive.exists():
                raise DatasetIdentityError(
                    f"the dataset is not on this node ({node}): {archive} not found; make the "
                    f"archive folder ({', '.join(NAMES.values())}) reachable here, at the "
                    "same path, or tell the replica where it is (automlperf worker --data-root)")
            check_identity(archive, index.identities[split])
        return index
    for split in ("train", "val"):
        rows = index.rows(split)
        for path in [f"{index.root}/{split}", *(index.path(r) for r in (rows[0], rows[-1]))]:
            if not os.path.exists(path):
                raise DatasetIdentityError(
                    f"the dataset is not on this node ({node}): {path} not "
                    f"found, though the run's index lists {len(index):,} images under "
                    f"{index.root}; make the data folder reachable here, at the same path, or "
                    "tell the replica where it is (automlperf worker --data-root)")
    return index
