"""A bundle's record of its best accuracy re-measured: ``remeasurement.json``, written by
``automlperf check --remeasure --record BUNDLE`` and verified wherever the bundle goes.

Re-measuring needs the validation set and, for ImageNet, an accelerator's hours; a list
cannot always do it itself. Whoever has the data (the list-keeper, or the site for it) runs
``check --remeasure --record``: when the bundle verifies and the accuracy is confirmed, the
figures of the re-measurement go into ``remeasurement.json`` and the manifest lists it (an
archive is written again). The record names the manifest it was measured against (its
SHA-256 without the record's own line), the best trial, its epoch and its weights' SHA-256,
the accuracy recorded and re-measured, on how many images, in which precision, the
tolerance, the device, the time and the automlperf version.

What a reader (``check BUNDLE``, ``automlperf list``) trusts of it, and why: its digest is in
the manifest, like every file; it was made on exactly this bundle (the manifest it names is
the bundle's, so any file changed since, or a record moved from another bundle, shows);
and it agrees with the records: the best trial and its best epoch, the accuracy and image
count recorded for that epoch, the precision, the weights, and a measured accuracy within
the tolerance of the rule (:func:`automlperf.submission.remeasure.tolerance`). It cannot show
who ran it: a submitter could write one by hand. A list-keeper who re-measures with the data
(``list --data-dir``, or the built-in datasets, which ``list`` always re-measures) does not
need to trust it; one who cannot, trusts the record only as far as whoever recorded it.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

from automlperf import __version__
from automlperf.submission.bundle import MANIFEST, BundleError, sha256, write_manifest
from automlperf.submission.remeasure import Remeasurement, best_epoch, tolerance
from automlperf.store import EpochRecord, TrialRecord
from automlperf.store.records import read_versioned

RECORD = "remeasurement.json"
FORMAT = "automlperf-remeasurement"
VERSION = 1
# The name and format the record had before it took the word the rest of automlperf uses:
# bundles recorded then carry it so, and are still read and verified (never written so).
OLD_RECORD = "revalidation.json"
OLD_FORMAT = "automlperf-revalidation"
FORMATS = {RECORD: FORMAT, OLD_RECORD: OLD_FORMAT}


def record_name(folder: Path) -> str | None:
    """The file the bundle at ``folder`` keeps its record in: the current name, else the
    earlier one; None without a record."""
    return next((name for name in FORMATS if (folder / name).exists()), None)


def base_manifest_digest(folder: Path) -> str:
    """SHA-256 of the bundle's manifest without the record's own line (under either of its
    names): the bundle the record was made on."""
    lines = (folder / MANIFEST).read_text(encoding="utf-8").splitlines(keepends=True)
    kept = "".join(line for line in lines
                   if not any(line.rstrip("\n").endswith(f"  {name}") for name in FORMATS))
    return hashlib.sha256(kept.encode("utf-8")).hexdigest()


def write_record(folder: Path, again: Remeasurement, run: dict[str, Any],
                 data_dir: Path | None) -> dict[str, Any]:
    """Write ``remeasurement.json`` into the bundle folder ``folder`` (verified, with the
    accuracy confirmed) and the manifest again with it; returns the record. A record under
    the earlier name is replaced: a bundle holds one."""
    if not again.ok:
        raise ValueError("only a confirmed accuracy is recorded")
    weights = folder / "trials" / str(again.trial) / "weights.safetensors"
    record = {
        "format": FORMAT, "version": VERSION, "automlperf_version": __version__,
        "bundle_manifest_sha256": base_manifest_digest(folder),
        "run": run, "weights_sha256": sha256(weights), **again.to_dict(),
        "measured_at": time.time(), "host": platform.node(),
        "data_dir": None if data_dir is None else str(data_dir),
    }
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (folder / OLD_RECORD).unlink(missing_ok=True)
    write_manifest(folder)
    return record


def read_record(folder: Path) -> dict[str, Any] | None:
    """The bundle's record, if it has one (under either name, the current one first)."""
    name = record_name(folder)
    if name is None:
        return None
    return read_versioned(folder / name, name, FORMATS[name], VERSION, BundleError)


def verify_record(folder: Path, record: dict[str, Any], result: dict[str, Any],
                  trials: list[TrialRecord], epochs: list[EpochRecord]) -> list[str]:
    """What is wrong with the record of the bundle at ``folder``, against its verified
    ``result`` and records (empty when nothing is)."""
    bad: list[str] = []
    where = f"{record_name(folder) or RECORD}:"
    if record.get("bundle_manifest_sha256") != base_manifest_digest(folder):
        bad.append(f"{where} it was made on another bundle, or a file changed since it was "
                   "recorded")
    best = result.get("best_trial")
    trial = next((t for t in trials if t.id == best), None)
    if trial is None or record.get("trial") != best:
        return [*bad, f"{where} it re-measured trial {record.get('trial')}, but the best trial "
                      f"is {best}"]
    epoch = best_epoch(trial, epochs)
    wanted = {"epoch": epoch.epoch, "recorded": epoch.val_accuracy,
              "recorded_images": epoch.val_images, "images": epoch.val_images,
              "precision": epoch.precision}
    for name, value in wanted.items():
        if not _same(record.get(name), value):
            bad.append(f"{where} {name} is {record.get(name)!r}, but the records make it "
                       f"{value!r}")
    weights = folder / "trials" / str(best) / "weights.safetensors"
    if not weights.exists() or record.get("weights_sha256") != sha256(weights):
        bad.append(f"{where} it re-measured other weights than trials/{best}/"
                   "weights.safetensors")
    measured, images = record.get("measured"), record.get("images") or 0
    allowed = tolerance(str(record.get("precision")), int(images))
    if not isinstance(measured, (int, float)) or \
            not _same(measured, (record.get("correct") or 0) / max(1, images)):
        bad.append(f"{where} measured {measured!r} is not its {record.get('correct')!r} of "
                   f"{images} images")
    elif not _same(record.get("tolerance"), allowed) or \
            abs(measured - epoch.val_accuracy) > allowed or not record.get("ok"):
        bad.append(f"{where} it does not confirm the accuracy: {measured:.4f} measured, "
                   f"{epoch.val_accuracy:.4f} recorded, tolerance {allowed:.4f}")
    return bad


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def describe(record: dict[str, Any]) -> str:
    """Who re-measured, in a few words: when, on what, with which version."""
    when = time.strftime("%Y-%m-%d", time.gmtime(record.get("measured_at") or 0))
    return (f"recorded {when} on {record.get('device')} ({record.get('host')}), automlperf "
            f"{record.get('automlperf_version')}")
