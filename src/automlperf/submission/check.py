"""Verify a run directory: recompute every figure from what was stored, name each mismatch.

What is checked:
* each stored graph is valid and hashes to the hash its trial was recorded with, and the
  trial folder's graph.json is the same architecture;
* each epoch's operations equal the analytical count of its graph for the images, steps and
  batch size it recorded, and its step count fits its image count;
* the store's epochs and each trial's own log (trials/<id>/log.jsonl) agree, both ways:
  an epoch a log holds and the store does not, one the store holds and its log does not,
  one a log holds twice, and a trial whose log ends with an outcome the store tells
  otherwise are each named (:mod:`automlperf.store.ledger`), and so is a trial folder the
  store has no trial for;
* the configuration file is the one the run was started with;
* result.json and system.json equal a fresh computation under the ruleset the run was
  started with and the run's own records (:mod:`automlperf.submission.result_check`).

A submission bundle (:mod:`automlperf.submission.bundle`) is checked the same way, its exported
records standing for the store, after every file's digest is compared with its manifest and
what bundle.json says it holds with what it holds, and the record of a re-measurement it
carries, if any (:mod:`automlperf.submission.remeasure_record`). With ``remeasure``, the best
trial's accuracy is measured again from its weights (:mod:`automlperf.submission.remeasure`);
with ``record`` too, a bundle that verifies keeps that re-measurement as its record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.graph import Graph, GraphError
from automlperf.hardware import cores_available
from automlperf.measure.result import build_result
from automlperf.measure.sample_reader import PendingDigest
from automlperf.ops import count, epoch_ops
from automlperf.ops.count import OpCount
from automlperf.errors import UserError
from automlperf.submission import bundle
from automlperf.submission.remeasure import RemeasureError, Remeasurement, remeasure
from automlperf.submission.remeasure_record import read_record, verify_record, write_record
from automlperf.submission.node_check import (check_ceilings, check_devices, check_ranks,
                                              check_software)
from automlperf.submission.result_check import check_result, same
from automlperf.store.base import RunRecords
from automlperf.store.ledger import compare as ledger, read_logs
from automlperf.store.records import ExportedRecords
from automlperf.store.opening import run_store
from automlperf.store.rundir import RunDir
from automlperf.store.values import bulk
from automlperf.store import EpochRecord, TrialRecord
from automlperf.store.urls import strip_password

EPOCH_FIELDS = ("train_images", "val_images", "steps", "ops", "val_accuracy", "batch_size",
                "world_size", "precision", "ended_at", "skipped_images", "val_skipped")


@dataclass
class CheckReport:
    mismatches: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
    bundle: bool = False
    remeasurement: Remeasurement | None = None
    # A bundle's record of a re-measurement, once verified (or just written).
    recorded: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches


def official_refusal(result: dict[str, Any]) -> str | None:
    """Why a verified result is not an official, valid one, in one line (None if it is)."""
    if result.get("simulated"):
        sim = result.get("simulation") or {}
        return ("refused: a simulated run is never an official result (its accelerators were "
                f"modelled at {sim.get('sustained_ops_per_device', 0):.3g} OPS per device, "
                f"time compressed {sim.get('time_compression', 1):g}x, not measured)")
    if not result.get("valid"):
        rules_broken = ", ".join(v["rule"] for v in result.get("violations", [])) or "none named"
        return f"refused: not an official, valid result (rules not met: {rules_broken})"
    return None


@dataclass
class CheckOptions:
    """What else ``check`` does: re-measure the best accuracy (on ``device``), with the data
    at ``data_dir`` (which then also stands for the run's data folder), and ``record`` the
    re-measurement in the bundle."""

    store_url: str | None = None
    data_dir: Path | None = None
    remeasure: bool = False
    device: str | None = None
    record: bool = False


def check_run(path: Path, store_url: str | None = None,
              options: CheckOptions | None = None) -> CheckReport:
    """Verify a run directory, a bundle folder or a bundle .tar.gz (``store_url``: the
    run's store, if not the one it names)."""
    options = dataclasses.replace(options or CheckOptions(), store_url=store_url)
    with bundle.opened(Path(path)) as source:
        return check_source(source, options)


def check_source(source: bundle.Source, options: CheckOptions) -> CheckReport:
    """Verify what ``source`` opened; files are named as the user knows them."""
    rd = RunDir(source.root)
    if options.record and not (source.bundle and options.remeasure):
        raise RemeasureError("--record keeps a re-measurement in a bundle: give a bundle "
                             "(`automlperf submit` makes one) and --remeasure")
    if source.bundle:
        report = _check_bundle(rd, options)
        again = report.remeasurement
        if options.record and report.ok and again is not None and again.ok:
            meta = rd.meta()
            report.recorded = write_record(rd.path, again, {"id": meta.get("run_id"),
                                                            "name": meta.get("name")},
                                           options.data_dir)
            if source.archive is not None:
                bundle.pack(rd.path, source.archive)
    else:
        run_id = int(rd.meta()["run_id"])
        with run_store(rd.path, options.store_url) as store:
            report = _check(rd, run_id, store, options)
    report.mismatches = [source.name(m) for m in report.mismatches]
    return report


def _check_bundle(rd: RunDir, options: CheckOptions) -> CheckReport:
    """A bundle: its digests, what bundle.json says it holds, then the run's checks on its
    records. Any file may have been edited, so what cannot be read is a mismatch too."""
    bad = bundle.verify_manifest(rd.path)
    try:
        described = bundle.read_bundle_file(rd.path)
    except bundle.BundleError as exc:
        described = {}
        bad.append(str(exc))
    try:
        meta = rd.meta()
        run_id = int(meta["run_id"])
        records = ExportedRecords(rd.path)
        report = _check(rd, run_id, records, options)
        try:
            record = read_record(rd.path)
        except bundle.BundleError as exc:
            record = None
            report.mismatches.append(str(exc))
        if record is not None:
            wrong = verify_record(rd.path, record, report.result, records.trials(run_id),
                                  records.epochs(run_id))
            report.mismatches += wrong
            report.recorded = None if wrong else record
    except RemeasureError:
        raise  # asked for what the bundle cannot give: the user's error, said as such
    except (UserError, KeyError, ValueError, TypeError) as exc:
        report = CheckReport()
        report.mismatches.append(f"the figures cannot be recomputed from the bundle: {exc}")
        meta, run_id = {}, None
    report.bundle = True
    report.mismatches[:0] = bad
    if described and run_id is not None:
        _check_contents(rd, described, meta, run_id, report)
    return report


def _check_contents(rd: RunDir, described: dict[str, Any], meta: dict[str, Any], run_id: int,
                    report: CheckReport) -> None:
    """bundle.json and run.json against what the bundle holds."""
    bad = report.mismatches
    said = described.get("run") or {}
    if said.get("id") != run_id or said.get("name") != meta.get("name"):
        bad.append(f"{bundle.BUNDLE_FILE}: run {said.get('id')} ({said.get('name')!r}), but "
                   f"run.json names run {run_id} ({meta.get('name')!r})")
    held = {"trials": report.checked.get("trials"), "epochs": report.checked.get("epochs")}
    for what, held_count in held.items():
        if held_count is not None and described.get(what) != held_count:
            bad.append(f"{bundle.BUNDLE_FILE}: {described.get(what)} {what}, but the records "
                       f"hold {held_count}")
    samples = (described.get("samples") or {}).get("included")
    if "samples" in report.checked and samples != report.checked["samples"]:
        bad.append(f"{bundle.BUNDLE_FILE}: {samples} samples, but the records hold "
                   f"{report.checked['samples']}")
    for trial in described.get("weights") or []:
        if not (rd.trial(trial) / "weights.safetensors").exists():
            bad.append(f"trials/{trial}/weights.safetensors is missing (listed in "
                       f"{bundle.BUNDLE_FILE})")
    r = report.result
    best = r.get("best_trial")
    if best is not None and not r.get("simulated") and r.get("dataset") != "synthetic" and \
            best not in (described.get("weights") or []):
        bad.append(f"the best trial's weights (trials/{best}/weights.safetensors) are not in "
                   "the bundle: its accuracy cannot be re-measured")
    store = meta.get("store")
    if store and strip_password(store) != store:
        bad.append("run.json: its store URL holds a password")


def _check(rd: RunDir, run_id: int, store: RunRecords, options: CheckOptions) -> CheckReport:
    report = CheckReport()
    bad = report.mismatches
    config = _check_config(rd, store.run(run_id)["config"], bad)
    # A long run's samples are read in other processes while the graphs are checked.
    sampled = PendingDigest(store, run_id, store.segments(run_id))
    trials = store.trials(run_id)
    graphs_checked = _check_graphs(rd, trials)
    # Read while the graphs are checked in other processes.
    epochs = store.epochs(run_id)
    with bulk():
        logs = read_logs(rd.trial, (t.id for t in trials))
    graphs = graphs_checked(bad)
    _check_epochs(epochs, graphs, logs.epochs, bad)
    bad.extend(ledger(epochs, trials, logs).problems())
    # The system as the run recorded it in its store: system.json is held to it.
    system = store.run(run_id)["system"]
    nodes = store.nodes(run_id)
    replicas = store.replicas(run_id)
    check_devices(nodes, replicas, bad)
    check_ceilings(nodes, bad)
    check_ranks(epochs, trials, replicas, bad)
    check_software(nodes, system.get("provenance") or {}, bad)
    _check_identity(rd, store.run(run_id), bad)
    if rd.path.joinpath("trials").is_dir():
        known = {t.id for t in trials}
        bad.extend(f"trials/{p.name} holds a trial the store does not have"
                   for p in sorted(rd.path.joinpath("trials").iterdir(), key=lambda p: p.name)
                   if p.is_dir() and p.name.isdigit() and int(p.name) not in known)
    digest = sampled.result()
    report.checked = {"trials": len(trials), "epochs": len(epochs), "logged_epochs": len(logs.epochs),
                      "samples": digest.count}
    report.result = build_result(store, run_id, config, system, trials=trials, epochs=epochs,
                                 sampled=digest)
    check_result(rd, config, report.result, system, bad, options.data_dir)
    if options.remeasure:
        report.remeasurement = remeasure(rd.path, store, run_id, config, report.result,
                                         options.data_dir, options.device)
        if report.remeasurement.problem:
            bad.append(f"remeasurement: {report.remeasurement.problem}")
    return report


def _check_identity(rd: RunDir, run: dict[str, Any], bad: list[str]) -> None:
    """run.json names the run as its store does (result.json's name and date, which a list
    shows, are held to the store by check_result)."""
    name = rd.meta().get("name")
    if name != run.get("name"):
        bad.append(f"{rd.path / 'run.json'}: name is {name!r}, but the run's record has "
                   f"{run.get('name')!r}")


def _check_config(rd: RunDir, stored: dict[str, Any], bad: list[str]) -> Config:
    """The configuration file is the one the run was started with: the same settings, or
    the same file. The file leaves out unset (null) settings, which this version fills with
    its defaults; where a default changed since the run was written, only the file itself
    still matches the store."""
    import tomllib

    config = Config.load(rd.config)
    if (config.model_dump(mode="json") != Config.parse(stored).model_dump(mode="json")
            and tomllib.loads(rd.config.read_text()) != _without_nulls(stored)):
        bad.append(f"{rd.config} differs from the configuration the run was started with")
    return config


def _without_nulls(value: Any) -> Any:
    """A stored configuration as its TOML file holds it (TOML has no null)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


# Below this many trials the graphs are checked in this process; above, in one process per
# core (parsing and counting ten thousand graphs is most of what `check` does).
PARALLEL_FROM = 500


def _check_graphs(rd: RunDir, trials: list[TrialRecord]) -> Callable[[list[str]],
                                                                    dict[int, OpCount]]:
    """Each stored graph is valid and hashes to its trial's hash, and the trial folder's
    graph.json is the same architecture. Returns what waits for the answer: it adds the
    problems to the list it is given and returns the operation count of each valid graph,
    by trial."""
    items = [(t.id, t.graph_hash, t.graph_json, str(rd.trial(t.id) / "graph.json"))
             for t in trials]
    workers = min(cores_available(), math.ceil(len(items) / PARALLEL_FROM))
    if workers <= 1:
        checked = _verify_graphs(items)
        return lambda bad: _graph_counts(checked, bad)
    import concurrent.futures
    import multiprocessing

    size = math.ceil(len(items) / (4 * workers))
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"))
    parts = [pool.submit(_verify_graphs, items[i:i + size]) for i in range(0, len(items), size)]

    def finish(bad: list[str]) -> dict[int, OpCount]:
        try:
            return _graph_counts([row for part in parts for row in part.result()], bad)
        finally:
            pool.shutdown()
    return finish


def _graph_counts(checked: list[tuple[int, list[str], OpCount | None]],
                  bad: list[str]) -> dict[int, OpCount]:
    counts: dict[int, OpCount] = {}
    for trial_id, problems, ops in checked:
        bad.extend(problems)
        if ops is not None:
            counts[trial_id] = ops
    return counts


def _verify_graphs(items: list[tuple[int, str, str, str]]) -> list[tuple[int, list[str],
                                                                          OpCount | None]]:
    """(trial, problems, operation count) of each (trial, hash, stored graph, graph file)."""
    out: list[tuple[int, list[str], OpCount | None]] = []
    for trial_id, graph_hash, graph_json, path in items:
        problems: list[str] = []
        try:
            stored = json.loads(graph_json)  # once: it is also compared with the file
            g = Graph.from_dict(stored)
        except ValueError as exc:  # GraphError, or not JSON at all
            invalid = exc if isinstance(exc, GraphError) else f"graph file is not valid JSON: {exc}"
            out.append((trial_id, [f"trial {trial_id}: stored graph is invalid: {invalid}"], None))
            continue
        if g.content_hash() != graph_hash:
            problems.append(f"trial {trial_id}: stored graph hashes to {g.content_hash()}, but "
                            f"the trial was recorded with {graph_hash}")
        file = Path(path)
        if file.exists():
            text = file.read_text()
            written = _json_or_none(text)
            # A file that holds the stored graph itself needs no rebuilding.
            if written is None or written != stored:
                try:
                    on_disk = Graph.from_json(text).content_hash()
                except GraphError as exc:
                    problems.append(f"{file}: invalid graph: {exc}")
                else:
                    if on_disk != graph_hash:
                        problems.append(f"{file}: architecture {on_disk} differs from the "
                                        f"stored one ({graph_hash})")
        # Per image and per step: the same for every batch size.
        full = count(g)
        out.append((trial_id, problems, OpCount(full.forward, full.backward_grad,
                                                full.update_per_step, full.params, 1, {}, {})))
    return out


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _check_epochs(epochs: list[EpochRecord], counts: dict[int, OpCount],
                  logged: dict[tuple[int, int], dict[str, Any]], bad: list[str]) -> None:
    """Each epoch's operations equal the analytical count of its graph, its step count fits
    its image count, and the store and the trial's log agree on it."""
    stored = operator.attrgetter(*EPOCH_FIELDS)
    for e in epochs:
        where = f"trial {e.trial_id} epoch {e.epoch}"
        ops = counts.get(e.trial_id)
        if ops is not None:
            expected = epoch_ops(ops, e.train_images, e.steps, e.val_images)
            if expected != e.ops:
                bad.append(f"{where}: recorded {e.ops} ops, but {e.train_images} training and "
                           f"{e.val_images} validation images in {e.steps} steps of this "
                           f"graph make {expected}")
        per_rank = max(1, e.batch_size // max(1, e.world_size))
        shard = math.ceil((e.train_images + e.skipped_images) / max(1, e.world_size))
        if e.steps > math.ceil(shard / per_rank) + 1 or e.steps < (shard - 1) // per_rank:
            bad.append(f"{where}: {e.steps} steps cannot train {e.train_images} images at "
                       f"batch {e.batch_size} on {e.world_size} rank(s)")
        line = logged.get((e.trial_id, e.epoch))
        # Most agree exactly; only the others are compared field by field, floats closely.
        if line is not None and stored(e) != tuple(map(line.get, EPOCH_FIELDS)):
            for name in EPOCH_FIELDS:
                if not same(getattr(e, name), line.get(name)):
                    bad.append(f"{where}: store has {name} = {getattr(e, name)!r} but the trial "
                               f"log has {line.get(name)!r}")
