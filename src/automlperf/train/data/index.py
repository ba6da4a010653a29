"""The file index of an ImageNet-layout folder: its classes and images, scanned once per run
with the walker the dataset's identity uses, and shared with every rank as arrays."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from automlperf.dataset_identity import IMAGE_SUFFIXES, class_images, walk
from automlperf.train.data.base import DataError


def scan_image_folder(root: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """Classes (from train/) and (path, label) lists of train/ and val/."""
    splits: dict[str, list[tuple[str, int]]] = {}
    classes: list[str] = []
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise DataError(f"{folder} not found: an imagenet data dir needs "
                            "train/<class>/*.JPEG and val/<class>/*.JPEG (or a flat val/ with "
                            "LOC_val_solution.csv)")
        found = sorted(e.name for e in os.scandir(folder) if e.is_dir())
        if not found and split == "val":
            splits[split] = _flat_val(root, classes)
            continue
        if not found:
            raise DataError(f"{folder} has no class folders (expected {split}/<class>/*.JPEG)")
        if split == "train":
            classes = found
        elif set(found) - set(classes):
            extra = sorted(set(found) - set(classes))[0]
            raise DataError(f"{folder / extra}: class {extra!r} is not in train/")
        index = {c: i for i, c in enumerate(classes)}
        listing: list[tuple[str, int]] = []
        walk(root, folder, listing, sizes=False)
        items = [(str(root / rel), index[cls]) for cls, rel in class_images(listing)]
        if not items:
            raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in the class "
                            "folders")
        items.sort()
        splits[split] = items
    return classes, splits


def _flat_val(root: Path, classes: list[str]) -> list[tuple[str, int]]:
    """A flat val/ folder labelled by a ground-truth file (see dataset_identity.py)."""
    from automlperf.dataset_identity import DatasetIdentityError, flat_val_labels

    try:
        labels = flat_val_labels(root)
    except DatasetIdentityError as exc:
        raise DataError(str(exc)) from None
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({wnid for wnid in labels.values() if wnid not in index})
    if unknown:
        raise DataError(f"{root / 'val'}: labelled with class {unknown[0]!r}, which is not "
                        "in train/")
    if not labels:
        raise DataError(f"{root / 'val'}: no labelled images")
    return sorted((str(root / "val" / name), index[wnid]) for name, wnid in labels.items())


class FileIndex:
    """Every image of a folder dataset as flat arrays: the paths as one UTF-8 buffer with
    offsets, and the labels; training images first, then validation images.

    A list of 1.3 M (path, label) tuples is 1.3 M Python objects whose reference counts a
    forked worker writes to, copying the pages they live on; a few arrays are three objects.
    Saved to a folder, the arrays are memory-mapped by every rank, so the page cache holds
    one copy per node and the folders are scanned once per run, not at every rank start."""

    FILES = ("blob.npy", "offsets.npy", "labels.npy")

    def __init__(self, root: str, classes: list[str], blob: np.ndarray, offsets: np.ndarray,
                 labels: np.ndarray, train_size: int) -> None:
        self.root, self.classes = root, classes
        self.blob, self.offsets, self.labels = blob, offsets, labels
        self.train_size = train_size
        self.val_size = len(labels) - train_size

    @classmethod
    def scan(cls, root: Path | str) -> FileIndex:
        classes, splits = scan_image_folder(Path(root))
        items = splits["train"] + splits["val"]
        encoded = [path.encode() for path, _ in items]
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        labels = np.array([label for _, label in items], dtype=np.int32)
        return cls(str(root), classes, blob, offsets, labels, len(splits["train"]))

    def save(self, folder: Path | str) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, array in zip(self.FILES, (self.blob, self.offsets, self.labels)):
            np.save(folder / name, array)
        meta = {"root": self.root, "classes": self.classes, "train_size": self.train_size}
        (folder / "index.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, folder: Path | str) -> FileIndex:
        folder = Path(folder)
        try:
            meta = json.loads((folder / "index.json").read_text())
            arrays = [np.load(folder / name, mmap_mode="r") for name in cls.FILES]
        except (OSError, ValueError) as exc:
            raise DataError(f"{folder}: the image index cannot be read ({exc}); it is written "
                            "when the training processes start, so start them again") from None
        blob, offsets, labels = arrays
        return cls(meta["root"], meta["classes"], blob, offsets, labels, meta["train_size"])

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, row: int) -> str:
        return bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]).decode()

    def rows(self, split: str) -> range:
        return range(0, self.train_size) if split == "train" else range(self.train_size, len(self))

    def items(self, split: str) -> list[tuple[str, int]]:
        return [(self.path(r), int(self.labels[r])) for r in self.rows(split)]


def prepare_index(data_dir: Path | str | None, folder: Path | str) -> FileIndex:
    """Scan an image-folder dataset once and save its index for the training processes."""
    if data_dir is None:
        raise DataError("imagenet needs --data-dir: a folder with train/<class>/*.JPEG and "
                        "val/<class>/*.JPEG")
    index = FileIndex.scan(data_dir)
    index.save(folder)
    return index
