"""The file index of an ImageNet-layout folder, as training uses it: the arrays of
:class:`automlperf.dataset_identity.FileIndex` (the walker and the layout rules are the
identity's, so what training reads is what the identity counts), with the data errors a
trial reports. A run's primary saves one index in the run directory for every replica
(:func:`automlperf.dataset_identity.build_shared_index`); without one, a pool scans the
folder once for all its ranks (:func:`prepare_index`)."""

from __future__ import annotations

from pathlib import Path

from automlperf.dataset_identity import DatasetIdentityError, FileIndex
from automlperf.train.data.base import DataError

__all__ = ["FileIndex", "load_index", "prepare_index", "scan_image_folder"]


def scan_image_folder(root: Path | str) -> FileIndex:
    """Walk an image folder (no ``stat`` per file) and index it."""
    try:
        return FileIndex.scan(root)
    except DatasetIdentityError as exc:
        raise DataError(_layout_error(exc)) from None


def load_index(folder: Path | str, root: Path | str | None = None) -> FileIndex:
    """A saved index, its paths under ``root`` (this node's view of the data)."""
    try:
        return FileIndex.load(folder, root)
    except DatasetIdentityError as exc:
        raise DataError(str(exc)) from None


def _layout_error(exc: DatasetIdentityError) -> str:
    text = str(exc)
    if " not found: " in text:
        return (text.split(" not found: ")[0] + " not found: an imagenet data dir needs "
                "train/<class>/*.JPEG and val/<class>/*.JPEG (or a flat val/ with "
                "LOC_val_solution.csv)")
    return text


def prepare_index(data_dir: Path | str | None, folder: Path | str) -> FileIndex:
    """Scan an image-folder dataset once and save its index for the training processes."""
    if data_dir is None:
        raise DataError("imagenet needs --data-dir: a folder with train/<class>/*.JPEG and "
                        "val/<class>/*.JPEG")
    index = scan_image_folder(data_dir)
    index.save(folder)
    return index
