"""The index of an ImageNet-layout dataset, as training uses it: the arrays of
:class:`automlperf.dataset.index.FileIndex` (the dataset layer's, from the archives or a
folder, so what training reads is what the run's identity counts and its proof proved), with
the data errors a trial reports. A run's primary saves one index in the run directory for
every replica (:func:`automlperf.dataset.shared.build_shared_index`); without one, a pool
makes it once for all its ranks (:func:`prepare_index`): the archives' pass, or the folder's
walk."""

from __future__ import annotations

from pathlib import Path

from automlperf.dataset.archive import NAMES, is_archive_folder, scan_archives
from automlperf.dataset.folder import index_folder
from automlperf.dataset.index import DatasetIdentityError, FileIndex
from automlperf.train.data.base import DataError

__all__ = ["FileIndex", "load_index", "prepare_index", "scan_image_folder"]


def scan_image_folder(root: Path | str, splits: tuple[str, ...] = ("train", "val")) -> FileIndex:
    """Index a dataset: the archives (one pass over those of ``splits``), or a folder's
    walk (no ``stat`` per file)."""
    try:
        if is_archive_folder(root):
            found = scan_archives(root, splits)
            if found.problems:
                raise DatasetIdentityError("; ".join(found.problems))
            assert found.index is not None
            return found.index
        return index_folder(root)
    except DatasetIdentityError as exc:
        raise DataError(_layout_error(exc)) from None


def load_index(folder: Path | str, root: Path | str | None = None) -> FileIndex:
    """A saved index, its names under ``root`` (this node's view of the data)."""
    try:
        return FileIndex.load(folder, root)
    except DatasetIdentityError as exc:
        raise DataError(str(exc)) from None


def _layout_error(exc: DatasetIdentityError) -> str:
    text = str(exc)
    if " not found: " in text and not any(name in text for name in NAMES.values()):
        return (text.split(" not found: ")[0] + " not found: an imagenet data dir needs "
                "train/<class>/*.JPEG and val/<class>/*.JPEG (or a flat val/ with "
                f"LOC_val_solution.csv), or the official archives ({', '.join(NAMES.values())})")
    return text


def prepare_index(data_dir: Path | str | None, folder: Path | str) -> FileIndex:
    """Index a dataset once and save the index for the training processes."""
    if data_dir is None:
        raise DataError("imagenet needs --data-dir: the folder holding the ILSVRC-2012 "
                        "archives, or a folder with train/<class>/*.JPEG and val/<class>/*.JPEG")
    index = scan_image_folder(data_dir)
    index.save(folder)
    return index
