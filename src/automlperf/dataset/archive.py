"""The archive source: ImageNet-1k read from its official ILSVRC-2012 archives, never
extracted.

* ``ILSVRC2012_img_train.tar``: an uncompressed tar of 1,000 uncompressed tars, one per class
  (``n01440764.tar`` holding ``n01440764_10026.JPEG``, ...);
* ``ILSVRC2012_img_val.tar``: a tar of the 50,000 validation JPEGs
  (``ILSVRC2012_val_00000001.JPEG``, ...);
* ``ILSVRC2012_devkit_t12.tar.gz``: the validation labels, read as torchvision reads them:
  ``data/meta.mat`` (its synsets; the 1,000 without children are the classes, each with its
  ``ILSVRC2012_ID``) and ``data/ILSVRC2012_validation_ground_truth.txt`` (one ID per
  validation image, in the order of their sorted names).

:func:`scan_archives` reads each archive once, start to end (dataset/tarstream.py): its MD5
and the index of its images (class, offset, size) in one pass. Every image's bytes then lie
at a fixed offset, and a reader takes them with one ``pread`` (dataset/reader.py). The
classes are the devkit's (sorted WordNet ids, the folder source's numbering); the training
archive's class tars must be among them. No torch here.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automlperf.dataset.folder import is_image
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError, FileIndex
from automlperf.dataset.tarstream import ArchiveError, HashedStream, members

TRAIN, VAL, DEVKIT = "train", "val", "devkit"
# The official files, by part: what an archive folder holds.
NAMES: Mapping[str, str] = {TRAIN: "ILSVRC2012_img_train.tar", VAL: "ILSVRC2012_img_val.tar",
                            DEVKIT: "ILSVRC2012_devkit_t12.tar.gz"}
META = "ILSVRC2012_devkit_t12/data/meta.mat"
GROUND_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"
# Bytes of each image's start a caller may look at during the pass (its JPEG header: the
# markers that say progressive, CMYK, greyscale, EXIF), for a count of the file mix
# (train/data/jpeghead.py FileMix.add_bytes takes them with the size).
HEAD_BYTES = 4096

# Called with each image's name, its first HEAD_BYTES bytes and its size during the pass.
HeadHook = Callable[[str, bytes, int], None]


def is_archive_folder(root: Path | str) -> bool:
    """Whether ``root`` holds the official archives (any of them) rather than a folder of
    images: what decides which source reads it."""
    root = Path(root)
    return any((root / name).is_file() for name in NAMES.values())


@dataclass
class Pass:
    """What one pass over the archives found: each part's MD5, its identity as the open
    descriptor reported it before the pass (:func:`identity_of`), the bytes and seconds,
    the index, and each problem in one line (empty: every image has its class)."""

    md5: dict[str, str] = field(default_factory=dict)
    identities: dict[str, dict[str, int]] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    index: FileIndex | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


def identity_of(st: os.stat_result) -> dict[str, int]:
    """A file's identity as the file system reports it: its size, inode, and modification
    and change times. Not its device number, which differs between nodes that mount the
    same file system."""
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _open(root: Path, part: str) -> int:
    path = root / NAMES[part]
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise DatasetIdentityError(
            f"{path} not found: an ImageNet-1k archive folder holds {', '.join(NAMES.values())} "
            "as downloaded from image-net.org") from None
    except OSError as exc:
        raise DatasetIdentityError(f"{path} cannot be read ({exc.strerror or exc})") from None


def _hash_file(fd: int, name: str) -> str:
    stream = HashedStream(fd, name)
    return stream.finish()


def read_devkit(data: bytes, name: str = NAMES[DEVKIT]) -> tuple[list[str], list[str]]:
    """(the classes, sorted; each validation image's class, in the order of the images'
    sorted names) from the devkit's bytes, as torchvision reads them."""
    import numpy as np
    import scipy.io

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as devkit:
            meta_file = devkit.extractfile(META)
            truth_file = devkit.extractfile(GROUND_TRUTH)
            if meta_file is None or truth_file is None:
                raise KeyError(META)
            synsets = scipy.io.loadmat(io.BytesIO(meta_file.read()), squeeze_me=True)["synsets"]
            truth = [int(line) for line in truth_file.read().split()]
    except KeyError as exc:
        raise ArchiveError(f"{name}: {exc.args[0]} not found in it: not the ILSVRC-2012 "
                           "devkit") from None
    except (tarfile.TarError, OSError, ValueError, EOFError) as exc:
        raise ArchiveError(f"{name} cannot be read as the ILSVRC-2012 devkit ({exc})") from None
    leaves = np.atleast_1d(synsets)[np.atleast_1d(synsets["num_children"]) == 0]
    wnid_of = {int(i): str(w) for i, w in zip(np.atleast_1d(leaves["ILSVRC2012_ID"]),
                                              np.atleast_1d(leaves["WNID"]))}
    unknown = sorted({i for i in truth if i not in wnid_of})
    if unknown:
        raise ArchiveError(f"{name}: the ground truth names class {unknown[0]}, which "
                           "meta.mat has not among its leaves")
    return sorted(wnid_of.values()), [wnid_of[i] for i in truth]


def _pass_train(fd: int, name: str, number: Mapping[str, int],
                head: HeadHook | None) -> tuple[str, list[tuple[Any, ...]], list[str]]:
    """(MD5, rows, problems) of the training archive."""
    stream = HashedStream(fd, name)
    rows: list[tuple[Any, ...]] = []
    problems = []
    try:
        for outer in members(stream):
            wnid = outer.name.rsplit("/", 1)[-1].removesuffix(".tar")
            if not outer.name.endswith(".tar"):
                problems.append(f"{name}: {outer.name} is not a class tar")
                continue
            label = number.get(wnid)
            if label is None:
                problems.append(f"{name}: class {wnid} is not in the devkit's classes")
                continue
            for m in members(stream, outer.offset, outer.offset + outer.size):
                base = m.name.rsplit("/", 1)[-1]
                if not is_image(base):
                    problems.append(f"{name}: {outer.name}/{m.name} is not an image")
                    continue
                if head is not None:
                    head(base, stream.get(m.offset, min(m.size, HEAD_BYTES)), m.size)
                rows.append((f"train/{wnid}/{base}", label, m.offset, m.size))
    except BaseException:
        stream.abandon()
        raise
    return stream.finish(), rows, problems


def _pass_val(fd: int, name: str, number: Mapping[str, int], truth: list[str],
              head: HeadHook | None) -> tuple[str, list[tuple[Any, ...]], list[str]]:
    """(MD5, rows, problems) of the validation archive, labelled by the devkit."""
    stream = HashedStream(fd, name)
    found: list[tuple[str, int, int]] = []
    problems = []
    try:
        for m in members(stream):
            base = m.name.rsplit("/", 1)[-1]
            if not is_image(base):
                problems.append(f"{name}: {m.name} is not an image")
                continue
            if head is not None:
                head(base, stream.get(m.offset, min(m.size, HEAD_BYTES)), m.size)
            found.append((base, m.offset, m.size))
    except BaseException:
        stream.abandon()
        raise
    md5 = stream.finish()
    found.sort()
    if len(found) != len(truth):
        problems.append(f"{name} holds {len(found):,} images and the devkit labels "
                        f"{len(truth):,}: not the devkit of these images")
    rows = [(f"val/{wnid}/{base}", number[wnid], at, size)
            for (base, at, size), wnid in zip(found, truth)]
    return md5, rows, problems


def scan_archives(root: Path | str, splits: tuple[str, ...] = (TRAIN, VAL),
                  head: HeadHook | None = None) -> Pass:
    """One pass over the archives of ``splits`` in ``root`` (and the devkit, which labels
    them): each one's MD5 and identity, and the index of their images. ``head`` is given
    each image's name, first bytes and size as the pass meets it. Raises
    :class:`DatasetIdentityError` naming a file that is missing, not a tar, or changed while
    it was read."""
    root = Path(root)
    found = Pass()
    started = time.perf_counter()
    fds = {part: _open(root, part) for part in (DEVKIT, *splits)}
    try:
        for part, fd in fds.items():
            found.identities[part] = identity_of(os.fstat(fd))
        devkit = os.pread(fds[DEVKIT], found.identities[DEVKIT]["size"], 0)
        found.md5[DEVKIT] = hashlib.md5(devkit).hexdigest()
        classes, truth = read_devkit(devkit)
        number = {wnid: i for i, wnid in enumerate(classes)}
        rows: dict[str, list[tuple[Any, ...]]] = {}
        for part in splits:
            name = str(root / NAMES[part])
            if part == TRAIN:
                found.md5[part], rows[part], problems = _pass_train(fds[part], name, number, head)
            else:
                found.md5[part], rows[part], problems = _pass_val(fds[part], name, number,
                                                                  truth, head)
            found.problems += problems
        for part, fd in fds.items():
            after = identity_of(os.fstat(fd))
            if after != found.identities[part]:
                raise DatasetIdentityError(f"{root / NAMES[part]} changed while it was being "
                                           "read: leave the archives alone during a run")
        found.bytes = sum(found.identities[p]["size"] for p in fds)
    finally:
        for fd in fds.values():
            os.close(fd)
    for part in splits:
        if not rows[part]:
            found.problems.append(f"{root / NAMES[part]} holds no images")
    found.index = FileIndex.from_rows(
        root, classes, rows, ARCHIVES, archives={p: NAMES[p] for p in splits},
        identities={p: found.identities[p] for p in splits})
    found.seconds = time.perf_counter() - started
    return found


def md5_of(path: Path | str) -> tuple[str, dict[str, int]]:
    """(MD5, identity) of one file, read once (a keeper's archive, a staged copy)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        before = identity_of(os.fstat(fd))
        md5 = _hash_file(fd, str(path))
        if identity_of(os.fstat(fd)) != before:
            raise DatasetIdentityError(f"{path} changed while it was being read")
        return md5, before
    finally:
        os.close(fd)
