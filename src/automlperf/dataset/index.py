"""The index of a dataset: every image as a row of flat arrays, whichever source holds it.

Rows are the training images, then the validation images, each split sorted by its name
``<split>/<class>/<file>`` (a folder's relative path; an archive member's name under the class
its label gives, so a folder extracted from the archives has the same rows in the same order).
Labels number the classes in sorted order (empty ones too: they still define the network's
outputs). An archive's index adds where each image's bytes lie in its archive (``at``,
``sizes``): one ``pread`` reads it.

A list of 1.3 M (path, label) tuples is 1.3 M Python objects whose reference counts a forked
worker writes to, copying the pages they live on; a few arrays are a few objects. Saved to a
folder, the arrays are memory-mapped by every rank, so the page cache holds one copy per node.
Names are relative to the source's root, so a node that mounts the data elsewhere (a container,
a node-local copy) reads the same index under its own ``root``. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from automlperf.errors import UserError

INDEX_VERSION = 3  # 3: the source and an archive's offsets and sizes
FOLDER, ARCHIVES = "folder", "archives"
SPLITS = ("train", "val")


class DatasetIdentityError(UserError, ValueError):
    """The data has no layout automlperf can read, or is not what the run proved; the
    message says what to change."""


class FileIndex:
    """Every image of a dataset as flat arrays (see the module's description). ``source`` is
    :data:`FOLDER` or :data:`ARCHIVES`; an archive index names its archives by split
    (``archives``) and the identity each had when it was read (``identities``, as
    :func:`automlperf.dataset.proof.identity_of` records it)."""

    FILES = ("blob.npy", "offsets.npy", "labels.npy")
    ARCHIVE_FILES = ("at.npy", "sizes.npy")
    META = "index.json"

    def __init__(self, root: str, classes: list[str], blob: np.ndarray, offsets: np.ndarray,
                 labels: np.ndarray, train_size: int, source: str = FOLDER,
                 at: np.ndarray | None = None, sizes: np.ndarray | None = None,
                 archives: dict[str, str] | None = None,
                 identities: dict[str, dict[str, int]] | None = None) -> None:
        self.root, self.classes = str(root), classes
        self.blob, self.offsets, self.labels = blob, offsets, labels
        self.train_size = train_size
        self.val_size = len(labels) - train_size
        self.source = source
        self.at, self.sizes = at, sizes
        self.archives = archives or {}
        self.identities = identities or {}

    @classmethod
    def from_rows(cls, root: Path | str, classes: list[str], rows: dict[str, list[tuple[Any, ...]]],
                  source: str = FOLDER, archives: dict[str, str] | None = None,
                  identities: dict[str, dict[str, int]] | None = None) -> FileIndex:
        """The index of ``rows`` by split: (name, label) for a folder, (name, label, at, size)
        for archives; each split is sorted here."""
        items = sorted(rows.get("train", [])) + sorted(rows.get("val", []))
        encoded = [item[0].encode() for item in items]
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        labels = np.array([item[1] for item in items], dtype=np.int32)
        at = sizes = None
        if source == ARCHIVES:
            at = np.array([item[2] for item in items], dtype=np.int64)
            sizes = np.array([item[3] for item in items], dtype=np.int64)
        return cls(str(root), classes, blob, offsets, labels, len(rows.get("train", [])), source,
                   at, sizes, archives, identities)

    def save(self, folder: Path | str, **meta: Any) -> None:
        """The arrays and ``index.json`` (the classes, the split, the source, and ``meta``),
        the JSON last: a folder with it is complete."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / self.META).unlink(missing_ok=True)
        for name, array in self._arrays():
            np.save(folder / name, array)
        text = json.dumps({"version": INDEX_VERSION, "root": self.root, "classes": self.classes,
                           "train_size": self.train_size, "source": self.source,
                           "archives": self.archives, "identities": self.identities, **meta})
        tmp = folder / f".{self.META}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / self.META)

    def _arrays(self) -> list[tuple[str, np.ndarray]]:
        arrays = list(zip(self.FILES, (self.blob, self.offsets, self.labels)))
        if self.source == ARCHIVES:
            assert self.at is not None and self.sizes is not None
            arrays += list(zip(self.ARCHIVE_FILES, (self.at, self.sizes)))
        return arrays

    @classmethod
    def load(cls, folder: Path | str, root: Path | str | None = None) -> FileIndex:
        """A saved index, its arrays memory-mapped; names resolve under ``root`` (default: the
        root it was made from)."""
        meta = read_index_meta(folder)
        source = meta.get("source", FOLDER)
        names = cls.FILES + (cls.ARCHIVE_FILES if source == ARCHIVES else ())
        try:
            arrays = [np.load(Path(folder) / name, mmap_mode="r") for name in names]
        except (OSError, ValueError) as exc:
            raise DatasetIdentityError(f"{folder}: the image index cannot be read ({exc}); "
                                       "scan the data again") from None
        blob, offsets, labels, *placed = arrays
        at, sizes = placed if placed else (None, None)
        return cls(str(root or meta["root"]), meta["classes"], blob, offsets, labels,
                   meta["train_size"], source, at, sizes, meta.get("archives"),
                   meta.get("identities"))

    def digest(self) -> str:
        """A SHA-256 of everything a reader takes from the index (names, labels, classes,
        the split, where each image lies): what a run records of the index it proved, and
        what a process that loads the index again holds it to."""
        h = hashlib.sha256(json.dumps([self.source, self.classes, self.train_size]).encode())
        for _, array in self._arrays():
            h.update(np.ascontiguousarray(array).data)
        return "sha256:" + h.hexdigest()

    def __len__(self) -> int:
        return len(self.labels)

    def relative(self, row: int) -> str:
        """The image's name: ``<split>/<class>/<file>``."""
        return bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]).decode()

    def split_of(self, row: int) -> str:
        return "train" if row < self.train_size else "val"

    def path(self, row: int) -> str:
        """A folder's image file (an archive's image has no file of its own: :meth:`where`)."""
        return f"{self.root}/{self.relative(row)}"

    def archive_path(self, split: str) -> str:
        return f"{self.root}/{self.archives[split]}"

    def where(self, row: int) -> str:
        """Where the image is, in words: its file, or its archive and member."""
        if self.source != ARCHIVES:
            return self.path(row)
        return f"{self.archive_path(self.split_of(row))}:{self.relative(row).rsplit('/', 1)[-1]}"

    def rows(self, split: str) -> range:
        return range(0, self.train_size) if split == "train" else range(self.train_size, len(self))

    def items(self, split: str) -> list[tuple[str, int]]:
        return [(self.where(r), int(self.labels[r])) for r in self.rows(split)]

    def nbytes(self) -> dict[str, int]:
        """Bytes of the arrays: what a reader touches to read images (``reading``: labels,
        offsets and sizes) and the names (read only to name an image)."""
        reading = self.labels.nbytes + (self.at.nbytes + self.sizes.nbytes
                                        if self.at is not None and self.sizes is not None else 0)
        return {"reading": int(reading), "names": int(self.blob.nbytes + self.offsets.nbytes)}


def read_index_meta(folder: Path | str) -> dict[str, Any]:
    path = Path(folder) / FileIndex.META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetIdentityError(f"{folder}: the image index cannot be read ({exc}); scan "
                                   "the data again") from None
    if meta.get("version") != INDEX_VERSION:
        raise DatasetIdentityError(f"{path}: index version {meta.get('version')!r}, this "
                                   f"automlperf reads {INDEX_VERSION}; scan the data again")
    return meta
