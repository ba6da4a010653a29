"""The official data proven by content: a site's ImageNet-1k folder held against the
official archives file by file, once, and a manifest that lets every run prove it again
in seconds.

The identity (:mod:`automlperf.dataset_identity`) counts classes and images; a resized or
re-encoded copy of ImageNet passes it, and decodes faster. ``automlperf verify-data``:

1. reads each official archive (``ILSVRC2012_img_train.tar``, which holds one tar per class,
   and ``ILSVRC2012_img_val.tar``) once, as a stream, its MD5 computed on the way and compared
   with the published one (:data:`OFFICIAL_ARCHIVES`, as torchvision's ImageNet metadata
   records them);
2. compares every image member, by SHA-256, with the file the folder holds under its name
   (``train/<wnid>/<name>``; the validation image wherever the folder's layout puts it), and
   names the members the folder lacks and the folder's images no archive holds;
3. when everything agrees, writes the manifest in the data folder (:data:`MANIFEST`): a
   header with the folder's identity fingerprint (every file's name and size), then one line
   per image, ``path<TAB>size<TAB>sha256``. Its root digest is the SHA-256 of its text.

Before its clock starts an official run checks that the folder's fingerprint is the
manifest's (no file added, removed, renamed or resized since) and hashes a random sample of
its files (:data:`SAMPLE`) against the manifest; it records the root digest, and ``check``
samples again where the data is reachable. No torch here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from automlperf.dataset_identity import DatasetIdentityError, is_image, scan, walk_splits
from automlperf.errors import UserError

# (file name, MD5) of the official ILSVRC-2012 archives, by split.
OFFICIAL_ARCHIVES: Mapping[str, tuple[str, str]] = {
    "train": ("ILSVRC2012_img_train.tar", "1d675b47d978889d74fa0da5fadfb00e"),
    "val": ("ILSVRC2012_img_val.tar", "29b22e2961454d5413ddabcf34fc5622"),
}
MANIFEST = "automlperf-manifest.tsv.gz"
FORMAT = "automlperf-data-manifest"
# Files a run hashes against the manifest: one in a hundred forged files is found with
# probability 1 - 0.99^500 > 99 %, for half a second of reading on a local disk.
SAMPLE = 500
CHUNK = 1 << 20


class DataProofError(UserError, ValueError):
    """The data cannot be proven official; the message names the file and what to do."""


@dataclass
class Verified:
    """What ``verify-data`` found: files compared, and each difference in one line."""

    compared: int = 0
    differences: list[str] = field(default_factory=list)
    manifest: Path | None = None
    root: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differences


class _Hashing(io.RawIOBase):
    """A file read once, its MD5 taken on the way."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.md5 = f, hashlib.md5()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.f.read(len(buf))
        self.md5.update(data)
        buf[:len(data)] = data
        return len(data)


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _members(archive: Path) -> Iterator[tuple[str, int, str] | str]:
    """(member name, size, SHA-256) of every image in ``archive``, looking inside the tars it
    holds (the training archive's classes), then its MD5 as the last item."""
    with open(archive, "rb") as raw:
        hashing = _Hashing(raw)
        with tarfile.open(fileobj=io.BufferedReader(hashing, CHUNK), mode="r|") as outer:
            for member in outer:
                if not member.isfile():
                    continue
                f = outer.extractfile(member)
                assert f is not None
                if member.name.endswith(".tar"):
                    with tarfile.open(fileobj=f, mode="r|") as inner:
                        for m in inner:
                            g = inner.extractfile(m) if m.isfile() else None
                            if g is not None and is_image(m.name):
                                yield (f"{Path(member.name).stem}/{Path(m.name).name}",
                                       m.size, hashlib.sha256(g.read()).hexdigest())
                elif is_image(member.name):
                    yield Path(member.name).name, member.size, hashlib.sha256(f.read()).hexdigest()
        # What the tar reader left unread (its end-of-archive padding) counts too.
        while hashing.read(CHUNK):
            pass
    yield hashing.md5.hexdigest()


def verify_folder(archives: Path | str, data_dir: Path | str,
                  table: Mapping[str, tuple[str, str]] = OFFICIAL_ARCHIVES) -> Verified:
    """Hold ``data_dir`` against the archives in ``archives`` (named and checksummed by
    ``table``) and, when every file agrees, write its manifest there."""
    archives, root = Path(archives), Path(data_dir)
    try:
        listing = walk_splits(root)
        found = scan(root, listing)
    except DatasetIdentityError as exc:
        raise DataProofError(str(exc)) from None
    images = {rel: size for rel, size in listing if is_image(rel)}
    # A validation image is found by its name wherever the layout puts it.
    val_at = {rel.rsplit("/", 1)[-1]: rel for rel in images if rel.startswith("val/")}
    result = Verified()
    entries: dict[str, tuple[int, str]] = {}
    for split, (name, md5) in table.items():
        path = archives / name
        if not path.is_file():
            raise DataProofError(f"{path} not found: give the folder holding {name} "
                                 "(--archives), as downloaded from image-net.org")
        for item in _members(path):
            if isinstance(item, str):
                if item != md5:
                    result.differences.insert(0, f"{path}: MD5 {item}, but the official "
                                              f"{name} has {md5}: not the published archive")
                continue
            member, size, sha = item
            rel = f"train/{member}" if split == "train" else val_at.get(member, f"val/{member}")
            if rel not in images:
                result.differences.append(f"{rel}: in {name}, not in the folder")
                continue
            result.compared += 1
            mine = file_sha256(root / rel)
            if mine != sha or images[rel] != size:
                result.differences.append(f"{rel} differs from its original in {name} "
                                          f"({images[rel]:,} bytes, {size:,} in the archive): "
                                          "resized or re-encoded")
            entries[rel] = (images[rel], mine)
    result.differences += [f"{rel}: in the folder, in no official archive"
                           for rel in sorted(set(images) - set(entries))]
    if result.ok:
        result.manifest, result.root = write_manifest(root, found.fingerprint, entries, table)
    return result


def write_manifest(root: Path, fingerprint: str, entries: Mapping[str, tuple[int, str]],
                   table: Mapping[str, tuple[str, str]]) -> tuple[Path, str]:
    """The manifest, written beside the data (atomically); its path and root digest."""
    header = {"format": FORMAT, "version": 1, "fingerprint": fingerprint,
              "archives": {split: {"name": n, "md5": m} for split, (n, m) in table.items()},
              "files": len(entries)}
    text = json.dumps(header, sort_keys=True) + "\n" + "".join(
        f"{rel}\t{size}\t{sha}\n" for rel, (size, sha) in sorted(entries.items()))
    path = root / MANIFEST
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path, "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Manifest:
    header: dict[str, Any]
    # ``path<TAB>size<TAB>sha256`` per image, in path order (a tab sorts before any character
    # of a path, so the lines' order is the paths'). Kept as text: a run samples 500 of
    # ImageNet's 1.3 million, and parsing them all cost it two seconds.
    lines: list[str]
    root: str

    def entry(self, line: str) -> tuple[str, int, str]:
        """One line's path, size and SHA-256."""
        rel, size, sha = line.split("\t")
        return rel, int(size), sha


def read_manifest(data_dir: Path | str) -> Manifest:
    path = Path(data_dir) / MANIFEST
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
        first, _, body = text.partition("\n")
        header = json.loads(first)
        if header.get("format") != FORMAT:
            raise ValueError("not a manifest of automlperf's")
        lines = body.splitlines()
        if header.get("files") != len(lines) or body.count("\t") != 2 * len(lines):
            raise ValueError(f"{len(lines):,} lines, not the {header.get('files')} files of "
                             "three fields its header counts")
        lines.sort()  # already sorted as written: one pass
    except FileNotFoundError:
        raise DataProofError(f"{path} not found: prove the folder's content once with "
                             f"`automlperf verify-data --archives DIR --data-dir {data_dir}` "
                             "(DIR holding the official ILSVRC2012 tar files), or run "
                             "unofficially (--unofficial)") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DataProofError(f"{path} cannot be read ({exc}): write it again with "
                             "`automlperf verify-data`") from None
    return Manifest(header, lines, "sha256:" + hashlib.sha256(text.encode()).hexdigest())


def sample_check(data_dir: Path | str, fingerprint: str | None, sample: int = SAMPLE,
                 seed: int | None = None) -> dict[str, Any]:
    """The folder held against its manifest: the same file list and sizes (``fingerprint``,
    the identity's), and ``sample`` random files by content. Returns what a run records:
    the root digest, the files sampled and the seed; raises :class:`DataProofError` naming
    the first difference."""
    manifest = read_manifest(data_dir)
    if fingerprint != manifest.header.get("fingerprint"):
        raise DataProofError(f"{Path(data_dir)}: its files (names and sizes) are not the ones "
                             f"{MANIFEST} was written for: files were added, removed, renamed "
                             "or resized since; run `automlperf verify-data` again")
    seed = random.SystemRandom().randrange(1 << 32) if seed is None else seed
    lines = manifest.lines
    picked = random.Random(seed).sample(lines, min(sample, len(lines)))
    for line in picked:
        try:
            rel, _, sha = manifest.entry(line)
        except ValueError:
            raise DataProofError(f"{Path(data_dir) / MANIFEST}: a damaged line ({line[:80]!r}): "
                                 "write it again with `automlperf verify-data`") from None
        try:
            mine = file_sha256(Path(data_dir) / rel)
        except OSError as exc:
            raise DataProofError(f"{rel}: cannot be read to prove it ({exc})") from None
        if mine != sha:
            raise DataProofError(f"{Path(data_dir) / rel} differs from the official file the "
                                 f"manifest records (SHA-256 {mine[:16]}..., official "
                                 f"{sha[:16]}...): restore it from the archives")
    return {"root": manifest.root, "sampled": len(picked), "seed": seed,
            "files": len(lines)}
