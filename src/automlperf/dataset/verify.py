"""A site's tool, not an official proof: an extracted ImageNet-1k folder held against the
official archives file by file (``automlperf verify-data``), and the folder's layout-free
content root.

An official result reads the archives themselves (dataset/proof.py). A site that trains
unofficial runs on an extracted copy can check it here: each archive is read once, as a
stream (its MD5 compared with the published one on the way), every image member compared by
SHA-256 with the file the folder holds under its name (``train/<wnid>/<name>``; a validation
image wherever the folder's layout puts it, its class held to the devkit's label), and the
members the folder lacks and the folder's images no archive holds are named.

The content root is a SHA-256 over the sorted lines ``<split> <class> <sha256>`` of every
image: it depends on the images and their classes only, not on names or layout, so a list
keeper can compute it once from the archives and publish it. Only a ruleset that holds such a
constant could let a folder be official again; none does. No torch here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from automlperf import rules
from automlperf.dataset.archive import DEVKIT, NAMES, TRAIN, VAL, read_devkit
from automlperf.dataset.folder import flat_val_labels, is_image, scan, walk_splits
from automlperf.dataset.index import DatasetIdentityError
from automlperf.dataset.proof import PUBLISHED, table
from automlperf.dataset.tarstream import HashedStream, members
from automlperf.errors import UserError

CHUNK = 1 << 20


class DataProofError(UserError, ValueError):
    """The folder cannot be compared with the archives; the message names what to do."""


@dataclass
class Verified:
    """What ``verify-data`` found: files compared, each difference in one line, and the
    folder's content root (once every file agrees)."""

    compared: int = 0
    differences: list[str] = field(default_factory=list)
    root: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differences


def file_sha256(path: Path | str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def content_root(lines: list[str]) -> str:
    """The layout-free root of ``<split> <class> <sha256>`` lines, one per image."""
    return "sha256:" + hashlib.sha256("".join(f"{line}\n" for line in sorted(lines)).encode()).hexdigest()


def _images(archive: Path, split: str) -> Iterator[tuple[str, str, str] | str]:
    """(class or "", file name, SHA-256) of every image of an archive, then its MD5."""
    fd = os.open(archive, os.O_RDONLY)
    try:
        stream = HashedStream(fd, str(archive))
        try:
            for outer in members(stream):
                if split == TRAIN and outer.name.endswith(".tar"):
                    wnid = outer.name.rsplit("/", 1)[-1].removesuffix(".tar")
                    for m in members(stream, outer.offset, outer.offset + outer.size):
                        base = m.name.rsplit("/", 1)[-1]
                        if is_image(base):
                            yield wnid, base, hashlib.sha256(stream.get(m.offset, m.size)).hexdigest()
                elif is_image(outer.name):
                    yield "", outer.name.rsplit("/", 1)[-1], hashlib.sha256(
                        stream.get(outer.offset, outer.size)).hexdigest()
        except BaseException:
            stream.abandon()
            raise
        yield stream.finish()
    finally:
        os.close(fd)


def verify_folder(archives: Path | str, data_dir: Path | str,
                  ruleset: rules.Ruleset = rules.CURRENT) -> Verified:
    """Hold ``data_dir`` against the archives (and devkit) in ``archives``, named and
    checksummed as ``ruleset`` publishes them."""
    archives, root = Path(archives), Path(data_dir)
    try:
        listing = walk_splits(root)
        found = scan(root, listing)
    except DatasetIdentityError as exc:
        raise DataProofError(str(exc)) from None
    kind, want = table(ruleset)
    images = {rel: size for rel, size in listing if is_image(rel)}
    val_at = {rel.rsplit("/", 1)[-1]: rel for rel in images if rel.startswith("val/")}
    flat = found.layout != "class folders"
    result = Verified()
    for part in (TRAIN, VAL, DEVKIT):
        if not (archives / NAMES[part]).is_file():
            raise DataProofError(f"{archives / NAMES[part]} not found: give the folder holding "
                                 f"{', '.join(NAMES.values())} (--archives), as downloaded "
                                 "from image-net.org")
    devkit = (archives / NAMES[DEVKIT]).read_bytes()
    _note_md5(result, archives / NAMES[DEVKIT], hashlib.md5(devkit).hexdigest(),
              want.get(DEVKIT), kind)
    _, truth = read_devkit(devkit, str(archives / NAMES[DEVKIT]))
    flat_labels = flat_val_labels(root) if flat else {}
    lines: list[str] = []
    seen: set[str] = set()
    for split in (TRAIN, VAL):
        path = archives / NAMES[split]
        val_names: list[tuple[str, str]] = []
        for item in _images(path, split):
            if isinstance(item, str):
                _note_md5(result, path, item, want.get(split), kind)
                continue
            wnid, base, sha = item
            if split == VAL:
                val_names.append((base, sha))
                continue
            _compare(result, root, images, f"train/{wnid}/{base}", sha, NAMES[split], seen)
            lines.append(f"train {wnid} {sha}")
        val_names.sort()
        for (base, sha), wnid in zip(val_names, truth):
            rel = val_at.get(base, f"val/{wnid}/{base}")
            if _compare(result, root, images, rel, sha, NAMES[split], seen):
                mine = flat_labels.get(base) if flat else rel.split("/")[1]
                if mine != wnid:
                    result.differences.append(f"{rel}: in class {mine} in the folder, {wnid} in "
                                              "the devkit")
            lines.append(f"val {wnid} {sha}")
    result.differences += [f"{rel}: in the folder, in no official archive"
                           for rel in sorted(set(images) - seen)]
    if result.ok:
        result.root = content_root(lines)
    return result


def _note_md5(result: Verified, path: Path, md5: str, expected: str | None, kind: str) -> None:
    if expected and md5 != expected:
        whose = "the published" if kind == PUBLISHED else "the test table's"
        result.differences.insert(0, f"{path}: MD5 {md5}, but {whose} {path.name} has "
                                  f"{expected}: not the published archive")


def _compare(result: Verified, root: Path, images: dict[str, int], rel: str, sha: str,
             archive: str, seen: set[str]) -> bool:
    """Whether the folder holds ``rel``; a difference noted when its content is not ``sha``."""
    if rel not in images:
        result.differences.append(f"{rel}: in {archive}, not in the folder")
        return False
    seen.add(rel)
    result.compared += 1
    if file_sha256(root / rel) != sha:
        result.differences.append(f"{rel} differs from its original in {archive} "
                                  f"({images[rel]:,} bytes): resized or re-encoded")
    return True
