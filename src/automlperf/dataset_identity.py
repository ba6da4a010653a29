"""The identity of an image-folder dataset: which classes and images it holds, and a
fingerprint of its file list, so an official result can show it trained on ImageNet-1k.

Accepted layouts:
* ``train/<wnid>/*`` and ``val/<wnid>/*`` (class folders);
* ``train/<wnid>/*`` and a flat ``val/*`` whose labels come from Kaggle's
  ``LOC_val_solution.csv`` (in the data folder or in ``val/``), which names each image's WordNet
  id. The devkit's ``ILSVRC2012_validation_ground_truth.txt`` numbers classes in the order of
  the devkit's ``meta.mat``, not the WordNet id order, so it is not accepted on its own.

The fingerprint is a SHA-256 over every file's relative name and size, in sorted order: it
changes when a file is added, removed, renamed or resized, and costs one ``stat`` per file.
No torch here.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from automlperf.folderwalk import collector_paused, walk
from automlperf.rules import DatasetRules
from automlperf.errors import UserError

# The one list of image files: what training reads is what the identity counts.
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
KAGGLE_LABELS = "LOC_val_solution.csv"
DEVKIT_LABELS = "ILSVRC2012_validation_ground_truth.txt"


class DatasetIdentityError(UserError, ValueError):
    """The data folder has no layout automlperf can read; the message says what to change."""


@dataclass
class DatasetScan:
    """What a data folder holds."""

    layout: str
    train: dict[str, int]  # class -> images
    val: dict[str, int]
    fingerprint: str
    files: int
    others: list[str] = field(default_factory=list)  # files that are not images, relative
    unlabelled: list[str] = field(default_factory=list)  # flat val images without a label
    unmatched: list[str] = field(default_factory=list)  # labels without an image

    @property
    def train_images(self) -> int:
        return sum(self.train.values())

    @property
    def val_images(self) -> int:
        return sum(self.val.values())

    def summary(self) -> dict[str, Any]:
        """What a run records: layout, counts and fingerprint (not the per-class table)."""
        return {"layout": self.layout, "classes": len(self.train),
                "train_images": self.train_images, "val_images": self.val_images,
                "files": self.files, "fingerprint": self.fingerprint}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def class_images(listing: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """(class, relative path) of the images in class folders (``split/<class>/<file>``) of
    a walked listing; anything else is not an image of the dataset."""
    out = []
    for rel, _ in listing:
        parts = rel.split("/")
        if len(parts) == 3 and is_image(parts[2]):
            out.append((parts[1], rel))
    return out


def fingerprint(listing: list[tuple[str, int]]) -> str:
    digest = hashlib.sha256()
    for rel, size in sorted(listing):
        digest.update(f"{rel}\t{size}\n".encode())
    return "sha256:" + digest.hexdigest()


def _labels_file(root: Path) -> Path | None:
    for candidate in (root / KAGGLE_LABELS, root / "val" / KAGGLE_LABELS):
        if candidate.is_file():
            return candidate
    return None


def read_kaggle_labels(path: Path) -> dict[str, str]:
    """Image id (file name without suffix) -> WordNet id, from LOC_val_solution.csv."""
    labels = {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
            raise DatasetIdentityError(f"{path}: not Kaggle's {KAGGLE_LABELS} (its header must "
                                       "be ImageId,PredictionString)")
        for line, row in enumerate(rows, start=2):
            if len(row) < 2 or not row[1].split():
                raise DatasetIdentityError(f"{path}:{line}: no label for {row[:1]}")
            labels[row[0].strip()] = row[1].split()[0]
    return labels


def flat_val_labels(root: Path) -> dict[str, str]:
    """Relative val file name -> WordNet id, for a flat val/ folder with a label file."""
    root = Path(root)
    path = _labels_file(root)
    if path is None:
        hint = (f"; {DEVKIT_LABELS} numbers classes in the devkit's meta.mat order, which "
                "automlperf does not map" if (root / DEVKIT_LABELS).exists()
                or (root / "val" / DEVKIT_LABELS).exists() else "")
        raise DatasetIdentityError(f"{root / 'val'} holds images but no class folders, and no "
                                   f"{KAGGLE_LABELS} names their classes{hint}: put val images "
                                   f"in val/<wnid>/ folders or add Kaggle's {KAGGLE_LABELS}")
    labels = read_kaggle_labels(path)
    out = {}
    for entry in os.scandir(root / "val"):
        if entry.is_file() and is_image(entry.name):
            wnid = labels.get(Path(entry.name).stem)
            if wnid is not None:
                out[entry.name] = wnid
    return out


def walk_splits(root: Path | str, sizes: bool = True) -> list[tuple[str, int]]:
    """Every file under ``train/`` then ``val/`` as (relative path, size): the one walk a
    dataset's identity and its file index share."""
    root = Path(root)
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DatasetIdentityError(f"{root / split} not found: the data folder needs "
                                       "train/<class>/ and val/<class>/ (or a flat val/ with "
                                       f"{KAGGLE_LABELS})")
    listing: list[tuple[str, int]] = []
    walk(root / "train", listing, sizes, "train/")
    walk(root / "val", listing, sizes, "val/")
    return listing


def scan(root: Path | str, listing: list[tuple[str, int]] | None = None) -> DatasetScan:
    """Read the file list of an image-folder dataset (one ``stat`` per file), or judge the
    ``listing`` that :func:`walk_splits` already made of it."""
    root = Path(root)
    listing = walk_splits(root) if listing is None else list(listing)
    train: Counter[str] = Counter()
    val: Counter[str] = Counter()
    others: list[str] = []
    flat_val = [rel for rel, _ in listing if rel.startswith("val/") and rel.count("/") == 1]
    val_has_folders = any(rel.startswith("val/") and rel.count("/") >= 2 for rel, _ in listing)
    labels_path = None
    unlabelled: list[str] = []
    unmatched: list[str] = []
    if val_has_folders or not flat_val:
        layout = "class folders"
        labels: dict[str, str] = {}
    else:
        layout = f"flat val with {KAGGLE_LABELS}"
        labels_path = _labels_file(root)
        if labels_path is None:
            flat_val_labels(root)  # raises, naming what is missing
        assert labels_path is not None
        labels = read_kaggle_labels(labels_path)
        if labels_path.parent == root:
            listing.append((KAGGLE_LABELS, labels_path.stat().st_size))
    seen_ids = set()
    for rel, _ in listing:
        parts = rel.split("/")
        name = parts[-1]
        if rel == KAGGLE_LABELS or (labels_path is not None and rel == f"val/{KAGGLE_LABELS}"):
            continue
        if not is_image(name):
            others.append(rel)
        elif len(parts) == 3:
            (train if parts[0] == "train" else val)[parts[1]] += 1
        elif len(parts) == 2 and parts[0] == "val" and labels_path is not None:
            stem = Path(name).stem
            if stem in labels:
                val[labels[stem]] += 1
                seen_ids.add(stem)
            else:
                unlabelled.append(rel)
        else:
            others.append(rel)  # an image outside any class folder, or nested too deep
    if labels_path is not None:
        unmatched = sorted(set(labels) - seen_ids)
    return DatasetScan(layout=layout, train=dict(sorted(train.items())),
                       val=dict(sorted(val.items())), fingerprint=fingerprint(listing),
                       files=len(listing), others=sorted(others),
                       unlabelled=sorted(unlabelled), unmatched=unmatched)


def _some(names: list[str] | set[str], limit: int = 3) -> str:
    items = sorted(names)
    more = f" and {len(items) - limit:,} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def problems(found: DatasetScan, rules: DatasetRules) -> list[str]:
    """How the scanned data differs from the official dataset; empty when it is identical."""
    out = []
    official = set(rules.classes)
    for split, classes in (("train", found.train), ("val", found.val)):
        missing, extra = official - set(classes), set(classes) - official
        if missing:
            out.append(f"{split}: {len(classes):,} classes instead of {len(official):,}; "
                       f"missing {_some(missing)}" if len(classes) != len(official) else
                       f"{split}: missing class(es) {_some(missing)}")
        if extra:
            out.append(f"{split}: class(es) not in ImageNet-1k: {_some(extra)}")
    for split, have, want in (("train", found.train_images, rules.train_images),
                              ("val", found.val_images, rules.val_images)):
        if have != want:
            diff = f"{want - have:,} missing" if have < want else f"{have - want:,} extra"
            out.append(f"{split}: {have:,} images instead of {want:,} ({diff})")
    if found.others:
        out.append(f"extra file(s) that are not images in class folders: {_some(found.others)}")
    if found.unlabelled:
        out.append(f"val image(s) without a label in {KAGGLE_LABELS}: {_some(found.unlabelled)}")
    if found.unmatched:
        out.append(f"{KAGGLE_LABELS} lists image(s) that val/ lacks: {_some(found.unmatched)}")
    return out


def identify(root: Path | str, rules: DatasetRules) -> dict[str, Any]:
    """What a run records about its data: layout, counts, fingerprint and every difference
    from the official dataset (``problems``, empty when identical)."""
    found = scan(root)
    return {**found.summary(), "problems": problems(found, rules)}


# --- the file index: what training reads, scanned once per run -------------------------

class FileIndex:
    """Every image of a folder dataset as flat arrays: the paths relative to the data folder
    as one UTF-8 buffer with offsets, and the labels; training images first, then validation
    images, each split sorted by path. Labels number the class folders of ``train/`` in
    sorted order (empty ones too: they still define the network's outputs).

    A list of 1.3 M (path, label) tuples is 1.3 M Python objects whose reference counts a
    forked worker writes to, copying the pages they live on; a few arrays are three objects.
    Saved to a folder, the arrays are memory-mapped by every rank, so the page cache holds
    one copy per node. Paths are relative, so a node that mounts the data elsewhere (a
    container, a node-local copy) reads the same index under its own ``root``."""

    FILES = ("blob.npy", "offsets.npy", "labels.npy")
    META = "index.json"

    def __init__(self, root: str, classes: list[str], blob: np.ndarray, offsets: np.ndarray,
                 labels: np.ndarray, train_size: int) -> None:
        self.root, self.classes = str(root), classes
        self.blob, self.offsets, self.labels = blob, offsets, labels
        self.train_size = train_size
        self.val_size = len(labels) - train_size

    @classmethod
    def scan(cls, root: Path | str) -> FileIndex:
        """Walk the folder (no ``stat`` per file) and index it."""
        with collector_paused():
            return cls.from_listing(root, walk_splits(root, sizes=False))

    @classmethod
    def from_listing(cls, root: Path | str, listing: list[tuple[str, int]]) -> FileIndex:
        """The index of a walked listing (:func:`walk_splits`); the layout's problems that
        training cannot get past raise :class:`DatasetIdentityError`."""
        root = Path(root)
        classes = sorted(e.name for e in os.scandir(root / "train") if e.is_dir())
        if not classes:
            raise DatasetIdentityError(f"{root / 'train'} has no class folders (expected "
                                       "train/<class>/*.JPEG)")
        number = {c: i for i, c in enumerate(classes)}
        val_classes = sorted(e.name for e in os.scandir(root / "val") if e.is_dir())
        extra = sorted(set(val_classes) - set(classes))
        if extra:
            raise DatasetIdentityError(f"{root / 'val' / extra[0]}: class {extra[0]!r} is not "
                                       "in train/")
        by_split: dict[str, list[tuple[str, int]]] = {"train": [], "val": []}
        for cls_name, rel in class_images(listing):
            by_split[rel.split("/", 1)[0]].append((rel, number[cls_name]))
        if not val_classes:
            by_split["val"] = _flat_val_items(root, listing, number)
        for split, items in by_split.items():
            if not items:
                raise DatasetIdentityError(f"{root / split}: no images ({', '.join(IMAGE_SUFFIXES)})"
                                           " in the class folders")
            items.sort()
        items = by_split["train"] + by_split["val"]
        encoded = [rel.encode() for rel, _ in items]
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        labels = np.array([label for _, label in items], dtype=np.int32)
        return cls(str(root), classes, blob, offsets, labels, len(by_split["train"]))

    def save(self, folder: Path | str, **meta: Any) -> None:
        """The arrays and ``index.json`` (the classes, the split, and ``meta``), the JSON
        last: a folder with it is complete."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / self.META).unlink(missing_ok=True)
        for name, array in zip(self.FILES, (self.blob, self.offsets, self.labels)):
            np.save(folder / name, array)
        text = json.dumps({"version": INDEX_VERSION, "root": self.root, "classes": self.classes,
                           "train_size": self.train_size, **meta})
        tmp = folder / f".{self.META}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / self.META)

    @classmethod
    def load(cls, folder: Path | str, root: Path | str | None = None) -> FileIndex:
        """A saved index, its arrays memory-mapped; paths resolve under ``root`` (default: the
        folder it was scanned from)."""
        meta = read_index_meta(folder)
        try:
            arrays = [np.load(Path(folder) / name, mmap_mode="r") for name in cls.FILES]
        except (OSError, ValueError) as exc:
            raise DatasetIdentityError(f"{folder}: the image index cannot be read ({exc}); "
                                       "scan the data again") from None
        blob, offsets, labels = arrays
        return cls(str(root or meta["root"]), meta["classes"], blob, offsets, labels,
                   meta["train_size"])

    def __len__(self) -> int:
        return len(self.labels)

    def relative(self, row: int) -> str:
        return bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]).decode()

    def path(self, row: int) -> str:
        return f"{self.root}/{self.relative(row)}"

    def rows(self, split: str) -> range:
        return range(0, self.train_size) if split == "train" else range(self.train_size, len(self))

    def items(self, split: str) -> list[tuple[str, int]]:
        return [(self.path(r), int(self.labels[r])) for r in self.rows(split)]


INDEX_VERSION = 2  # relative paths


def _flat_val_items(root: Path, listing: list[tuple[str, int]],
                    number: dict[str, int]) -> list[tuple[str, int]]:
    """The labelled images of a flat val/ folder (see :func:`flat_val_labels`)."""
    path = _labels_file(root)
    if path is None:
        flat_val_labels(root)  # raises, naming what is missing
    assert path is not None
    labels = read_kaggle_labels(path)
    unknown = sorted({wnid for wnid in labels.values() if wnid not in number})
    if unknown:
        raise DatasetIdentityError(f"{root / 'val'}: labelled with class {unknown[0]!r}, which "
                                   "is not in train/")
    items = []
    for rel, _ in listing:
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == "val" and is_image(parts[1]):
            wnid = labels.get(Path(parts[1]).stem)
            if wnid is not None:
                items.append((rel, number[wnid]))
    if not items:
        raise DatasetIdentityError(f"{root / 'val'}: no labelled images")
    return items


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


# --- the run's shared index: scanned once, by the primary, read by every replica ---------

SHARED_INDEX = "dataset-index"  # in the run directory


@dataclass
class SharedIndex:
    """A run's dataset, scanned once: its identity (``found``), its file index, the folder
    they are saved in, how long the walk took and whether this process ``built`` it."""

    folder: Path
    found: DatasetScan
    index: FileIndex
    scan_s: float
    built: bool


def build_shared_index(data_dir: Path | str, run_dir: Path | str) -> SharedIndex:
    """Walk ``data_dir`` once (one ``stat`` per file) and save its identity and file index in
    ``RUN_DIR/dataset-index``, for the replicas and any later session of the run to load
    instead of walking it again. Raises :class:`DatasetIdentityError` for a layout that
    neither can use."""
    import socket
    import time

    root = Path(data_dir)
    started = time.perf_counter()
    with collector_paused():
        listing = walk_splits(root)
        found = scan(root, listing)
        index = FileIndex.from_listing(root, listing)
    took = time.perf_counter() - started
    folder = Path(run_dir) / SHARED_INDEX
    index.save(folder, found=found.to_dict(), stamps=folder_stamps(root, index.classes),
               scan_s=round(took, 3), scanned_at=time.time(), host=socket.gethostname(),
               bytes=sum(size for _, size in listing))
    return SharedIndex(folder, found, index, took, built=True)


def load_shared_index(run_dir: Path | str, data_dir: Path | str | None = None,
                      current: bool = True) -> SharedIndex | None:
    """The index :func:`build_shared_index` saved in the run directory, its paths under
    ``data_dir`` (default: where it was scanned); None when there is none, or, with
    ``current``, when a folder of the data changed since (a file added, removed or renamed:
    a folder's modification time, one ``stat`` per class folder)."""
    folder = Path(run_dir) / SHARED_INDEX
    if not (folder / FileIndex.META).exists():
        return None
    meta = read_index_meta(folder)
    root = Path(data_dir or meta["root"])
    if current:
        try:
            if folder_stamps(root, meta["classes"]) != meta["stamps"]:
                return None
        except OSError:
            return None
    index = FileIndex.load(folder, root)
    return SharedIndex(folder, DatasetScan(**meta["found"]), index, meta["scan_s"], built=False)


def check_data_here(index_dir: Path | str, data_dir: Path | str) -> FileIndex:
    """The run's saved index with its paths under this node's ``data_dir``, once the data is
    seen to be here: the split folders and the first and last image of each split exist (a
    handful of ``stat`` calls, where walking the folder would be a million). A node without
    the data raises :class:`DatasetIdentityError` naming the missing path."""
    import socket

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    index = FileIndex.load(index_dir, data_dir)
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


def folder_stamps(root: Path, classes: list[str]) -> dict[str, int]:
    """The modification time of the split folders and of every class folder in them."""
    stamps = {}
    for split in ("train", "val"):
        stamps[split] = os.stat(root / split).st_mtime_ns
        for name in classes:
            try:
                stamps[f"{split}/{name}"] = os.stat(root / split / name).st_mtime_ns
            except FileNotFoundError:
                stamps[f"{split}/{name}"] = -1
    return stamps
