"""The folder source: an image folder's layout, its identity (which classes and images it
holds, and a fingerprint of its file list) and its index. Folders are how users' own datasets
and unofficial runs are read; an official result reads the archives (dataset/archive.py).

Accepted layouts:
* ``train/<wnid>/*`` and ``val/<wnid>/*`` (class folders);
* ``train/<wnid>/*`` and a flat ``val/*`` whose labels come from Kaggle's
  ``LOC_val_solution.csv`` (in the data folder or in ``val/``), which names each image's WordNet
  id. The devkit's ``ILSVRC2012_validation_ground_truth.txt`` numbers classes in the order of
  the devkit's ``meta.mat``, not the WordNet id order, so it is not accepted on its own
  beside a folder (the archive source reads it with ``meta.mat``).

The fingerprint is a SHA-256 over every file's relative name and size, in sorted order: it
changes when a file is added, removed, renamed or resized, and costs one ``stat`` per file.
No torch here.
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from automlperf.dataset.index import FOLDER, DatasetIdentityError, FileIndex
from automlperf.dataset.walk import collector_paused, walk
from automlperf.rules import DatasetRules

# The one list of image files: what training reads is what the identity counts.
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
KAGGLE_LABELS = "LOC_val_solution.csv"
DEVKIT_LABELS = "ILSVRC2012_validation_ground_truth.txt"


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
        return {"source": FOLDER, "layout": self.layout, "classes": len(self.train),
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




# --- the folder's index: what training reads, walked once per run -----------------------

def index_folder(root: Path | str, listing: list[tuple[str, int]] | None = None) -> FileIndex:
    """The index of an image folder, from the walked ``listing`` (:func:`walk_splits`; walked
    here, with no ``stat`` per file, when not given). The layout's problems that training
    cannot get past raise :class:`DatasetIdentityError`."""
    root = Path(root)
    if listing is None:
        with collector_paused():
            listing = walk_splits(root, sizes=False)
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
    by_split: dict[str, list[tuple[Any, ...]]] = {"train": [], "val": []}
    for cls_name, rel in class_images(listing):
        by_split[rel.split("/", 1)[0]].append((rel, number[cls_name]))
    if not val_classes:
        by_split["val"] = _flat_val_items(root, listing, number)
    for split, items in by_split.items():
        if not items:
            raise DatasetIdentityError(f"{root / split}: no images ({', '.join(IMAGE_SUFFIXES)})"
                                       " in the class folders")
    return FileIndex.from_rows(root, classes, by_split, FOLDER)


def _flat_val_items(root: Path, listing: list[tuple[str, int]],
                    number: dict[str, int]) -> list[tuple[Any, ...]]:
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
    items: list[tuple[Any, ...]] = []
    for rel, _ in listing:
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == "val" and is_image(parts[1]):
            wnid = labels.get(Path(parts[1]).stem)
            if wnid is not None:
                items.append((rel, number[wnid]))
    if not items:
        raise DatasetIdentityError(f"{root / 'val'}: no labelled images")
    return items


def folder_stamps(root: Path, classes: list[str]) -> dict[str, int]:
    """The modification time of the split folders and of every class folder in them: a file
    added, removed or renamed changes its folder's."""
    stamps = {}
    for split in ("train", "val"):
        stamps[split] = os.stat(root / split).st_mtime_ns
        for name in classes:
            try:
                stamps[f"{split}/{name}"] = os.stat(root / split / name).st_mtime_ns
            except FileNotFoundError:
                stamps[f"{split}/{name}"] = -1
    return stamps
