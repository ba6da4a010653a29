"""Submission bundles on disk: their layout, the manifest of digests, packing into a
``.tar.gz`` and opening one (or a bundle folder, or a run directory) to read it.

A bundle (docs/bundle.md has every file and field)::

    bundle.json           what it is: format and version, submitter, system, what it holds
    MANIFEST.sha256       one "<sha256>  <path>" line per other file (``sha256sum -c`` reads it)
    result.json  config.toml  system.json  run.json  system_desc.json  mllog.txt
    report.html  trials.csv  replicas.csv (where the report lists only some)
    records/              the run's store, exported (automlperf.store.records)
    trials/<id>/          graph.json and log.jsonl of every trial; the best trial's
                          weights.safetensors

Nothing in it needs a database, or automlperf, to read: JSON, JSON Lines, TOML, CSV, HTML,
safetensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf.errors import UserError
from automlperf.store.records import RECORDS, read_versioned

FORMAT = "automlperf-bundle"
VERSION = 1
BUNDLE_FILE = "bundle.json"
MANIFEST = "MANIFEST.sha256"
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


class BundleError(UserError, ValueError):
    """Not a readable bundle; the message says why."""


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def files(folder: Path) -> list[str]:
    """Every file under ``folder`` but the manifest, as POSIX paths relative to it, sorted."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def write_manifest(folder: Path) -> int:
    """Write MANIFEST.sha256 over every other file of ``folder``; returns how many."""
    names = files(folder)
    (folder / MANIFEST).write_text("".join(f"{sha256(folder / n)}  {n}\n" for n in names),
                                   encoding="utf-8")
    return len(names)


def verify_manifest(folder: Path) -> list[str]:
    """Each file whose digest differs from the manifest's, each listed file that is missing,
    each file the manifest does not list, and each line it cannot read, named."""
    path = folder / MANIFEST
    if not path.exists():
        return [f"{MANIFEST} is missing: the bundle's files cannot be verified"]
    listed: dict[str, str] = {}
    bad = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                  .splitlines(), start=1):
        match = _LINE.match(line)
        if match is None:
            bad.append(f"{MANIFEST} line {number} is not '<sha256>  <path>': {line[:80]!r}")
            continue
        listed[match[2]] = match[1]
    present = set(files(folder))
    for name, digest in listed.items():
        if name not in present:
            bad.append(f"{name} is missing (listed in {MANIFEST})")
        elif sha256(folder / name) != digest:
            bad.append(f"{name}: its SHA-256 differs from the one in {MANIFEST} (the file, or "
                       "its line in the manifest, was changed)")
    for name in sorted(present - listed.keys()):
        bad.append(f"{name} is not listed in {MANIFEST} (added after the bundle was made)")
    return bad


def _order(name: str) -> tuple[Any, ...]:
    """Where a file goes in the archive. Alike files sit together, where gzip's 32 KiB window
    finds what they repeat: the graphs in a row, and each trial's epochs right after its log,
    whose numbers they repeat."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "trials" and parts[1].isdigit():
        trial = int(parts[1])
        if parts[2] == "graph.json":
            return (2, trial)
        if parts[2] == "log.jsonl":
            return (3, trial, 0)
        return (5, trial, parts[2])
    if len(parts) == 3 and parts[:2] == [RECORDS, "epochs"] and parts[2].split(".")[0].isdigit():
        return (3, int(parts[2].split(".")[0]), 1)
    if name == f"{RECORDS}/samples.jsonl":
        return (4,)
    if len(parts) == 1:
        return (0, name != BUNDLE_FILE, name)
    if parts[0] == RECORDS and len(parts) == 2:
        return (1, name)
    return (6, name)


def pack(folder: Path, out: Path) -> None:
    """``folder`` as a gzip-compressed tar at ``out`` (written beside it, then renamed), its
    files under one top-level folder named like the archive."""
    top = out.name.removesuffix(".gz").removesuffix(".tar") or "bundle"
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=9, format=tarfile.PAX_FORMAT) as tar:
            for name in sorted([MANIFEST, *files(folder)], key=_order):
                info = tar.gettarinfo(str(folder / name), arcname=f"{top}/{name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(folder / name, "rb") as f:
                    tar.addfile(info, f)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def is_bundle(folder: Path) -> bool:
    return (folder / BUNDLE_FILE).exists() or (folder / MANIFEST).exists()


def read_bundle_file(folder: Path) -> dict[str, Any]:
    """bundle.json of this or an earlier version."""
    path = folder / BUNDLE_FILE
    if not path.exists():
        raise BundleError(f"{BUNDLE_FILE} is missing: not a bundle written by `automlperf submit`")
    return read_versioned(path, BUNDLE_FILE, FORMAT, VERSION, BundleError)


@dataclass
class Source:
    """A run directory or a bundle, readable at ``root``. ``label`` is how the user named it,
    and ``archive`` the .tar.gz it was unpacked from (``root`` is then a temporary folder)."""

    root: Path
    label: str
    bundle: bool
    archive: Path | None = None

    def name(self, text: str) -> str:
        """``text`` with a bundle's files named by their place in the bundle (an unpacked
        archive's folder is temporary), as its manifest names them."""
        if not self.bundle:
            return text
        return text.replace(f"{self.root}/", "").replace(str(self.root), self.label)


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Source]:
    """A run directory, a bundle folder or a bundle .tar.gz, open for reading (an archive is
    unpacked into a temporary folder, removed afterwards)."""
    path = Path(path)
    if path.is_dir():
        yield Source(path, str(path), is_bundle(path))
        return
    if not path.exists():
        raise BundleError(f"{path} does not exist: give a run directory, a bundle folder or a "
                          "bundle .tar.gz")
    with tempfile.TemporaryDirectory(prefix="automlperf-bundle-") as tmp:
        root = _unpack(path, Path(tmp))
        yield Source(root, str(path), True, archive=path)


def _unpack(archive: Path, into: Path) -> Path:
    """Unpack ``archive`` (regular files and folders only, every path inside one top-level
    folder) and return that folder."""
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{archive} is not a bundle: not a readable .tar.gz ({exc})") from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BundleError(f"{archive} is damaged ({exc})") from None
        tops = set()
        for m in members:
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                raise BundleError(f"{archive}: {m.name!r} is not a plain file inside the "
                                  "bundle; refusing to unpack it")
            tops.add(parts[0])
        if len(tops) != 1:
            raise BundleError(f"{archive} is not a bundle: its files are not inside one folder")
        needed = sum(m.size for m in members)
        free = shutil.disk_usage(into).free
        if needed > free:
            raise BundleError(f"{archive} unpacks to {needed / 2**30:.1f} GiB but {into} has "
                              f"{free / 2**30:.1f} GiB free; set TMPDIR to a larger folder")
        try:
            tar.extractall(into, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BundleError(f"{archive} is damaged ({exc})") from None
    return into / tops.pop()
