"""Which copy of the run's data a replica reads, checked before it starts.

The primary's scan serves every replica (none walks a folder or reads the archives' headers
again): the saved index in ``RUN_DIR/dataset-index``. The data need only be on this node:

* the official archives: a copy staged on this node (runner/staging.py) whose MD5s, computed
  while it was copied, are the ones this session proved and whose identity is the one its
  staging recorded; else the shared copy, each archive the very file the session proved
  (its identity). The index is the session's (its digest). The node's description records
  which copy was read and what it was (result.json counts the staged and the unstaged);
* a folder: the staged copy if one was made, else the shared folder; the first and last image
  of each split are seen to be there.

A node without its data raises :class:`DatasetIdentityError`, naming what it lacks: its
replica retires in one line.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automlperf.dataset.archive import NAMES
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError, FileIndex, read_index_meta
from automlperf.dataset.proof import archive_identities, check_identity, sessions
from automlperf.dataset.shared import SHARED_INDEX, check_data_here
from automlperf.runner.staging import local_record

log = logging.getLogger("automlperf.replica")


@dataclass
class NodeData:
    """Where this replica reads the run's dataset (``data_dir``, ``index_dir``) and what its
    node description records of it (``record``)."""

    data_dir: Path
    index_dir: Path
    record: dict[str, Any] = field(default_factory=dict)


def for_replica(run_dir: Path, data_dir: Path, system: dict[str, Any]) -> NodeData | None:
    """The data this node's replica reads (None: the run saved no index to read by)."""
    shared = Path(run_dir) / SHARED_INDEX
    if not (shared / FileIndex.META).exists():
        return None
    if read_index_meta(shared).get("source") == ARCHIVES:
        return _archives(Path(run_dir), shared, data_dir, system)
    staged = local_record(run_dir)
    if staged is not None and staged.get("kind", "folder") == "folder":
        try:
            check_data_here(shared, staged["root"])
            log.info("reading the dataset staged on this node, %s", staged["root"])
            return NodeData(Path(staged["root"]), shared, {"source": "staged", "root": staged["root"]})
        except DatasetIdentityError as exc:
            log.warning("the dataset staged on this node is not usable (%s); reading %s "
                        "instead", exc, data_dir)
    check_data_here(shared, data_dir)
    return NodeData(data_dir, shared, {"source": "shared", "root": str(data_dir)})


def _archives(run_dir: Path, shared: Path, data_dir: Path, system: dict[str, Any]) -> NodeData:
    proofs = sessions(system)
    if not proofs or not proofs[-1].get("proof"):
        raise DatasetIdentityError(f"{run_dir}: the run recorded no proof of its archives for "
                                   "this session; resume the run")
    proof = proofs[-1]["proof"]
    md5s = {part: a["md5"] for part, a in proof["archives"].items()}
    staged = local_record(run_dir)
    if staged is not None and staged.get("kind") == ARCHIVES:
        try:
            return _staged(run_dir, shared, staged, proof, md5s)
        except DatasetIdentityError as exc:
            log.warning("the archives staged on this node are not usable (%s); reading %s "
                        "instead", exc, data_dir)
    index = check_data_here(shared, data_dir, proof["index"])
    identities = archive_identities(proof)
    for split in index.archives:
        if index.identities.get(split) != identities.get(split):
            raise DatasetIdentityError(f"{shared}: its archives' identities are not the ones "
                                       "this session proved: it was written since; resume the run")
    return NodeData(data_dir, shared, {"source": "shared", "root": str(data_dir),
                                       "archives": _seen(md5s, identities)})


def _staged(run_dir: Path, shared: Path, staged: dict[str, Any], proof: dict[str, Any],
            md5s: dict[str, str]) -> NodeData:
    """The staged archives, once they are seen to be what this session proved: their MD5s
    (computed while they were copied) the session's, each file the one staging recorded. Its
    index is the session's, saved on the node with the copy's identities, for the ranks to
    hold the copy to."""
    root = Path(staged["root"])
    copied = staged.get("archives") or {}
    for part, md5 in md5s.items():
        if (copied.get(part) or {}).get("md5") != md5:
            raise DatasetIdentityError(f"{root / NAMES[part]}: staged with MD5 "
                                       f"{(copied.get(part) or {}).get('md5')}, and this "
                                       f"session proved {md5}")
        check_identity(root / NAMES[part], archive_identities(staged)[part])
    index = FileIndex.load(shared, root)
    if index.digest() != proof["index"]:
        raise DatasetIdentityError(f"{shared} is not the index this session proved")
    index.identities = {split: archive_identities(staged)[split] for split in index.archives}
    view = root / "index"
    if view.exists():
        shutil.rmtree(view)
    index.save(view, digest=proof["index"])
    log.info("reading the archives staged on this node, %s", root)
    return NodeData(root, view, {"source": "staged", "root": str(root),
                                 "archives": _seen(md5s, archive_identities(staged))})


def _seen(md5s: dict[str, str], identities: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {part: {"name": NAMES[part], "md5": md5s[part], **identities.get(part, {})}
            for part in md5s}
