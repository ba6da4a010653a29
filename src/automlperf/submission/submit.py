"""``automlperf submit``: one verified run directory made into a submission bundle that a
list-keeper can verify with nothing else (layout: :mod:`automlperf.submission.bundle`).

A run is bundled only once ``check`` verifies it. The bundle holds an allow-list of the run's
files, never its logs folder, its private database or password files; run.json's store URL
is written without its password, and every text file is searched for a password in a URL
before the manifest is written. Weights: the best trial's only, unless asked for all.

Samples: a long run of many nodes holds a million monitor samples (a gigabyte of text, more
than everything else together). Above :data:`SAMPLE_LIMIT` the bundle keeps the ones the
energy figures need to come out the same (:func:`automlperf.measure.samples.energy_preserving`),
every k-th and each node's last; ``all_samples`` keeps all of them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automlperf import __version__
from automlperf.errors import UserError
from automlperf.submission import bundle
from automlperf.submission.mlperf import read_system_desc
from automlperf.submission.check import check_run
from automlperf.measure.result import read_result
from automlperf.measure.samples import energy_preserving
from automlperf.store.records import export_records
from automlperf.store.opening import run_store
from automlperf.store.rundir import RunDir
from automlperf.store.urls import redact, strip_password

SAMPLE_LIMIT = 20_000
# Copied as the run wrote them, when it has them.
TOP_FILES = ("result.json", "config.toml", "system.json", "system_desc.json", "mllog.txt",
             "report.html", "trials.csv", "replicas.csv")
REQUIRED = ("result.json", "config.toml", "system.json", "report.html")
_FIX = {"report.html": "write it with `automlperf report {run}`",
        "result.json": "finish the run first (`automlperf run --resume --run-dir {run}`)"}


class SubmitError(UserError, ValueError):
    """A run that cannot be bundled; the message says why and what to do."""


@dataclass
class Submitted:
    path: Path
    bytes: int
    files: int
    trials: int
    epochs: int
    samples_stored: int
    samples_included: int
    weights: list[int] = field(default_factory=list)


def submit(run_dir: Path, out: Path | None = None, as_dir: bool = False,
           submitter: str | None = None, system_name: str | None = None,
           all_weights: bool = False, all_samples: bool = False,
           store_url: str | None = None, sample_limit: int = SAMPLE_LIMIT,
           site_details: bool = True) -> Submitted:
    """Verify ``run_dir`` and write its bundle at ``out`` (a .tar.gz, or a folder with
    ``as_dir``; by default beside the current folder, named after the run). Without
    ``site_details`` its host, user, account, cluster names and paths are replaced by
    neutral names (:mod:`automlperf.submission.site`)."""
    rd = RunDir(Path(run_dir))
    if bundle.is_bundle(rd.path):
        raise SubmitError(f"{rd.path} is already a bundle: send it as it is")
    meta = rd.meta()
    for name in REQUIRED:
        if not (rd.path / name).exists():
            fix = _FIX.get(name, "it is written at the end of a run").format(run=rd.path)
            raise SubmitError(f"{rd.path / name} is missing: {fix}")
    out = Path(out) if out is not None else Path(f"{rd.path.name}" + ("" if as_dir else ".tar.gz"))
    if out.exists():
        raise SubmitError(f"{out} already exists: remove it or choose another --out")
    if not as_dir and not out.name.endswith((".tar.gz", ".tgz")):
        raise SubmitError(f"{out}: a bundle archive is named .tar.gz (or give --dir for a folder)")
    checked = check_run(rd.path, store_url)
    if not checked.ok:
        raise SubmitError(f"{rd.path} does not verify ({len(checked.mismatches)} mismatch(es), "
                          f"first: {checked.mismatches[0]}); `automlperf check {rd.path}` lists "
                          "them all. Only a run that verifies is bundled")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out if as_dir else Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        staging.mkdir(exist_ok=True)
        made = _fill(rd, meta, staging, submitter, system_name, all_weights, all_samples,
                     store_url, sample_limit)
        if not site_details:
            from automlperf.submission.site import leave_out, site_names

            leave_out(staging, site_names(staging, rd.path))
        count = bundle.write_manifest(staging)
        if not as_dir:
            bundle.pack(staging, out)
    except BaseException:
        if as_dir:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if not as_dir:
            shutil.rmtree(staging, ignore_errors=True)
    size = (sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) if as_dir
            else out.stat().st_size)
    return Submitted(out, size, count + 1, **made)


def _fill(rd: RunDir, meta: dict[str, Any], into: Path, submitter: str | None,
          system_name: str | None, all_weights: bool, all_samples: bool,
          store_url: str | None, sample_limit: int) -> dict[str, Any]:
    for name in TOP_FILES:
        if (rd.path / name).exists():
            shutil.copy2(rd.path / name, into / name)
    store = meta.get("store")
    (into / "run.json").write_text(json.dumps(
        {**meta, "store": strip_password(store) if store else None}, indent=1) + "\n")
    result = read_result(rd.result)
    run_id = int(meta["run_id"])
    with run_store(rd.path, store_url) as db:
        total = sum(db.sample_nodes(run_id).values())
        keep: Callable[[int], bool] | None = None
        if not all_samples and total > sample_limit:
            kept = energy_preserving(db.sample_figure_chunks(run_id), db.segments(run_id),
                                     total, sample_limit)
            keep = lambda i: bool(kept[i])  # noqa: E731
        exported = export_records(db, run_id, into, keep)
        trials = db.trials(run_id)
    weights = _trial_files(rd, into, trials, result, all_weights)
    _refuse_secrets(into)
    desc = read_system_desc(into)
    (into / bundle.BUNDLE_FILE).write_text(json.dumps({
        "format": bundle.FORMAT, "version": bundle.VERSION, "automlperf_version": __version__,
        "created_at": time.time(),
        "submitter": submitter or desc.get("submitter") or "unspecified",
        "system_name": system_name or desc.get("system_name") or result.get("system", {}).get("host"),
        "run": {"id": run_id, "name": meta.get("name")},
        "trials": exported.trials, "epochs": exported.epochs,
        "samples": {"stored": exported.samples_stored, "included": exported.samples_written,
                    "selection": "all" if keep is None else "energy-preserving"},
        "weights": weights,
    }, indent=1) + "\n")
    return {"trials": exported.trials, "epochs": exported.epochs,
            "samples_stored": exported.samples_stored,
            "samples_included": exported.samples_written, "weights": weights}


def _trial_files(rd: RunDir, into: Path, trials: list[Any], result: dict[str, Any],
                 all_weights: bool) -> list[int]:
    """Every trial's graph and log; the best trial's weights (every trial's with
    ``all_weights``). Returns the trials whose weights are included."""
    best = result.get("best_trial")
    weights = []
    for t in trials:
        src, dst = rd.trial(t.id), into / "trials" / str(t.id)
        dst.mkdir(parents=True)
        if (src / "graph.json").exists():  # `check` verified it is the stored architecture
            shutil.copy2(src / "graph.json", dst / "graph.json")
        else:
            (dst / "graph.json").write_text(t.graph_json + "\n")
        if (src / "log.jsonl").exists():
            shutil.copy2(src / "log.jsonl", dst / "log.jsonl")
        if (t.id == best or all_weights) and (src / "weights.safetensors").exists():
            shutil.copy2(src / "weights.safetensors", dst / "weights.safetensors")
            weights.append(t.id)
    trained = not result.get("simulated") and result.get("dataset") != "synthetic"
    if best is not None and trained and best not in weights:
        raise SubmitError(f"{rd.trial(best) / 'weights.safetensors'} is missing: the best "
                          "trial's weights are part of a bundle (its accuracy is re-measured "
                          "from them)")
    return weights


def _refuse_secrets(folder: Path) -> None:
    """No file of the bundle may hold a password in a URL (the run redacts them; this makes
    sure of it)."""
    for name in bundle.files(folder):
        if name.endswith(".safetensors") or name.startswith("records/epochs/"):
            continue
        text = (folder / name).read_text(encoding="utf-8", errors="replace")
        if redact(text) != text:
            line = next(n for n, line in enumerate(text.splitlines(), start=1)
                        if redact(line) != line)
            raise SubmitError(f"{name} line {line} holds a password in a URL: a bundle carries "
                              "no secret. Remove it from the run's file and submit again")
