"""The official data's proof: the run's own computation, every session, before its clock.

Each session of an official run reads the ILSVRC-2012 archives once (dataset/archive.py): their
MD5s, compared here with the ones the ruleset publishes (``DatasetRules.archives``, as
torchvision's ImageNet metadata records them), and the index of their images, built in the
same pass. Nothing the run stored earlier counts: a manifest, a cache of a verification or an
earlier session's index could be written by hand; an MD5 that equals a published constant,
computed over the very files the run then reads, cannot.

The session records each archive's identity as the file system reports it (size, inode,
modification and change times; not the device number, which differs between nodes that
mount one file system), and every process that opens an archive holds it to that identity
(:func:`check_identity`): an archive replaced or changed after the proof is named, and the
result is not valid.

Tests swap the published table for one of their generated archives through
:data:`TEST_TABLE_ENV`; a run proven against such a table records it, and is never
official (:func:`judge`), whatever else it records. No torch here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from automlperf.dataset.archive import DEVKIT, NAMES, TRAIN, VAL, HeadHook, Pass, identity_of, scan_archives
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError
from automlperf.rules import Ruleset

# A JSON file of MD5s by part ({"train": ..., "val": ..., "devkit": ...}) that stands for the
# published ones: tests' generated archives only. A result proven against it is not official.
TEST_TABLE_ENV = "AUTOMLPERF_TEST_ARCHIVE_MD5S"
PUBLISHED, TEST = "published", "test"
# The words every refusal for an archive that changed after its proof contains: the result's
# judgement finds a replica that gave up for it by them.
CHANGED = "changed since the run proved it"
LAYOUT = "ILSVRC-2012 archives"


class DataChanged(DatasetIdentityError):
    """An archive is not the file the run proved; the message names it."""


def table(ruleset: Ruleset) -> tuple[str, dict[str, str]]:
    """Which MD5s prove the archives: (:data:`PUBLISHED`, the ruleset's), or (:data:`TEST`,
    a test's own, where :data:`TEST_TABLE_ENV` names a file of them)."""
    path = os.environ.get(TEST_TABLE_ENV)
    if path:
        try:
            given = json.loads(Path(path).read_text())
            return TEST, {part: str(given[part]) for part in NAMES}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DatasetIdentityError(f"{TEST_TABLE_ENV}={path}: not a table of the archives' "
                                       f"MD5s ({exc})") from None
    return PUBLISHED, {part: md5 for part, (_, md5) in ruleset.dataset.archives.items()}


def prove(root: Path | str, ruleset: Ruleset, head: HeadHook | None = None) -> tuple[Pass, dict[str, Any]]:
    """One pass over the archives in ``root``: what it found, and the dataset identity a run
    records of it (counts, the index's digest as its fingerprint, every problem in one line,
    and the proof: the table, each archive's MD5 and identity, the seconds and bytes)."""
    root = Path(root)
    found = scan_archives(root, head=head)
    kind, want = table(ruleset)
    problems = list(found.problems)
    for part in (TRAIN, VAL, DEVKIT):
        expected = want.get(part)
        if expected and found.md5[part] != expected:
            whose = "the published" if kind == PUBLISHED else "the test table's"
            problems.insert(0, f"{root / NAMES[part]}: MD5 {found.md5[part]}, but {whose} "
                            f"{NAMES[part]} has {expected}: not the official archive")
    index = found.index
    assert index is not None
    digest = index.digest()
    identity = {
        "source": ARCHIVES, "layout": LAYOUT, "classes": len(index.classes),
        "train_images": index.train_size, "val_images": index.val_size, "files": len(index),
        "fingerprint": digest, "problems": problems,
        "proof": {"table": kind, "index": digest, "seconds": round(found.seconds, 3),
                  "bytes": found.bytes, "mb_per_s": round(found.mb_per_s, 1),
                  "archives": {part: {"name": NAMES[part], "md5": found.md5[part],
                                      **found.identities[part]} for part in (TRAIN, VAL, DEVKIT)}},
    }
    return found, identity


def archive_identities(proof: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The identity of each archive a proof recorded, by part."""
    return {part: {k: int(v[k]) for k in ("size", "inode", "mtime_ns", "ctime_ns")}
            for part, v in proof.get("archives", {}).items()}


def check_identity(path: Path | str, expected: Mapping[str, int],
                   st: os.stat_result | None = None) -> None:
    """Hold the file at ``path`` (or its ``st``, from the descriptor just opened) to the
    identity the run proved; raises :class:`DataChanged` naming it and what differs."""
    try:
        seen = identity_of(st if st is not None else os.stat(path))
    except FileNotFoundError:
        raise DataChanged(f"{path} is gone: it {CHANGED}; restore it, or start a new run") from None
    differs = [f"{k} {seen[k]} (proven {expected[k]})" for k in ("size", "inode", "mtime_ns",
                                                                "ctime_ns") if seen[k] != expected[k]]
    if differs:
        raise DataChanged(f"{path} {CHANGED}: {', '.join(differs)}; the run reads only the "
                          "archives it proved (restore them and resume, or start a new run)")


def sessions(system: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each session's dataset identity as the run recorded it: the first session's, then
    those of its resumed sessions."""
    first = system.get("dataset_identity")
    return ([first] if first else []) + list(system.get("data_sessions", []))


def judge(system: Mapping[str, Any], ruleset: Ruleset) -> str | None:
    """Why the run's data is not the official dataset as ``ruleset`` proves it (None: it
    is): every session read the archives, proved against the published MD5s, found no
    problem, and saw no archive change."""
    want = {part: md5 for part, (_, md5) in ruleset.dataset.archives.items()}
    for number, identity in enumerate(sessions(system), start=1):
        session = f"session {number}: " if number > 1 else ""
        if identity.get("source") != ARCHIVES:
            return (f"{session}the data was read from a folder; ruleset {ruleset.id} proves "
                    f"ImageNet-1k only by its archives ({', '.join(NAMES.values())})")
        if identity.get("problems"):
            return session + "; ".join(identity["problems"])
        proof = identity.get("proof") or {}
        if proof.get("table") != PUBLISHED:
            return (f"{session}the archives were proven against a test table of MD5s "
                    f"({TEST_TABLE_ENV}), not the ones ruleset {ruleset.id} publishes")
        for part, md5 in want.items():
            got = (proof.get("archives", {}).get(part) or {}).get("md5")
            if got != md5:
                return (f"{session}{NAMES[part]} has MD5 {got}, but ruleset {ruleset.id} "
                        f"publishes {md5}: not the official archive")
        if proof.get("changed"):
            return session + "; ".join(proof["changed"])
    return None
