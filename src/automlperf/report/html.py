"""The report: one self-contained HTML file per run (charts inline, no network needed)."""

from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path
from typing import Any

import jinja2

from automlperf import __version__
from automlperf.config import FIXED, Config
from automlperf.graph import Graph
from automlperf.measure.result import build_result, read_result, simulation_of
from automlperf.measure.sample_reader import PendingDigest
from automlperf.measure.units import format_energy, format_ops
from automlperf.measure.score import (EpochLike, Span, counted_epochs, replica_timeline, spans,
                                      timeline)
from automlperf.ops import count, layer_table
from automlperf.report import charts, progress
from automlperf.store.opening import run_store
from automlperf.store.rundir import RunDir, write_atomic
from automlperf.store import EpochRecord, TrialRecord, redact
from automlperf.store.base import RunRecords

# "j2": the templates are report.html.j2, and what a run recorded (names, reasons) is text.
_env = jinja2.Environment(loader=jinja2.PackageLoader("automlperf.report", "templates"),
                          autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                          lstrip_blocks=True)
_env.filters["ops"] = format_ops
_env.filters["energy"] = format_energy
_env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.2f} %"
_env.filters["num"] = lambda v: "-" if v is None else f"{v:,}"
_env.filters["seconds"] = lambda v: "-" if v is None else f"{v:.1f} s"
_env.filters["when"] = lambda t: datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


# A long run's report stays small (a few MB at 10,000 trials and 500,000 epochs): the table
# lists this many trials, the score chart this many points.
TABLE_ROWS = 1000
CURVE_POINTS = 2000
# At 10,000 replicas a row per replica in each of three sections made a 13 MB report: past
# this many, each lists the replicas that tell most (the least training, the lowest measured
# ceilings), and every replica is in replicas.csv beside the report.
REPLICA_ROWS = 256

BREAKDOWN_LABELS = [("start_to_first_epoch_s", "start to first epoch"),
                    ("training_s", "training"), ("data_wait_s", "of which waiting for data"),
                    ("device_wait_s", "of which the device's"),
                    ("validation_s", "validation"), ("candidate_wait_s", "waiting for a candidate"),
                    ("between_trials_s", "between epochs and trials"),
                    ("lost_at_deadline_s", "lost at the deadline")]


def _morph_text(morphs: list[dict[str, Any]]) -> str:
    parts = []
    for m in morphs:
        if m["op"] == "deepen":
            parts.append(f"deepen k{m.get('kernel')}")
        elif m["op"] == "widen":
            parts.append(f"widen {m.get('from')}→{m.get('to')}")
        else:
            parts.append("skip" + (" proj" if m.get("projection") else ""))
    return ", ".join(parts) or "seed"


def list_or(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _ancestry(trial_id: int, trials: dict[int, Any]) -> list[int]:
    """Trial ids from the first ancestor down to ``trial_id``, following parent links."""
    chain = [trial_id]
    while (parent := trials[chain[-1]].parent_id) is not None and parent in trials \
            and parent not in chain:
        chain.append(parent)
    return chain[::-1]


def _config_rows(config: Config) -> list[dict[str, Any]]:
    custom = config.customised()
    rows = []
    for section, values in config.model_dump(mode="json").items():
        for key, value in values.items():
            name = f"{section}.{key}"
            rows.append({"name": name, "value": json.dumps(value),
                         "fixed": name in FIXED, "customised": name in custom,
                         "changed_fixed": name in FIXED and value != list_or(FIXED[name])})
    return rows


def gather(run_dir: Path, store_url: str | None = None) -> dict[str, Any]:
    """Everything the report shows, as plain data:

    * the score curve, with a mark at every counted epoch's end;
    * each trial's validation accuracy over the run time;
    * the trial table: architecture size, hyperparameters, outcome, training time;
    * the best trial and its line of ancestors;
    * the configuration, system, sessions, nodes, resource samples and time breakdown.
    """
    rd = RunDir(Path(run_dir))
    with run_store(rd.path, store_url) as store:
        return _gather(rd, store, store_url)


def _gather(rd: RunDir, store: RunRecords, store_url: str | None) -> dict[str, Any]:
    run_id = int(rd.meta()["run_id"])
    config = Config.load(rd.config)
    system = json.loads(rd.system.read_text()) if rd.system.exists() else {}
    segments = store.segments(run_id)
    # A long run's samples are read in other processes meanwhile.
    pending = PendingDigest(store, run_id, segments, chart=True)
    epochs = store.epochs(run_id)
    trials = store.trials(run_id)
    result = read_result(rd.result) if rd.result.exists() else build_result(
        store, run_id, config, system, trials=trials, epochs=epochs, sampled=pending.result())
    if config.simulated and not result.get("simulated"):
        # result.json edited to look measured: the configuration the run was started with
        # (`check` holds it to the store's) still says what it was.
        result = {**result, "simulated": True, "simulation": simulation_of(config)}
    # The result's own way of charging time (results from before it was recorded: to the
    # last counted epoch, with no grace).
    charging = result.get("charging") or {"rule": "last_epoch", "grace_s": 0.0}
    counted = counted_epochs(epochs, segments, float(charging.get("grace_s") or 0.0))
    trial_by_id = {t.id: t for t in trials}
    best_id = result.get("best_trial")
    best_trial = trial_by_id.get(best_id) if best_id is not None else None
    chain = _ancestry(best_trial.id, trial_by_id) if best_trial else []
    shown = shown_trials(trials, chain)
    rows, graphs = _trial_rows(shown, epochs)
    row_by_id = {row["id"]: row for row in rows}
    lineage = [row_by_id[i] for i in chain]
    # A simulated trainer starts a child where its curve model says, not from the parent.
    search = progress.progress(counted, trial_by_id, chain,
                               config.search.inherit_weights and not config.simulated,
                               _morph_text)
    for row, node in zip(lineage, search["lineage"]):
        row["birth"] = node["birth"]
    replicas = store.replicas(run_id)
    sampled = pending.result()
    breakdown = result.get("time_breakdown")
    described = result.get("node_descriptions") or []
    nodes = sorted({(r.host, tuple(r.devices)) for r in replicas})
    return {
        "run_dir": str(rd.path), "result": result, "config": config,
        "config_rows": _config_rows(config), "system": system,
        "curve": _score_curve(counted, config, spans(counted, segments, {
            t.id: t.replica_index for t in trials}) if charging.get("rule") == "per_replica"
            else None),
        "series": _accuracy_series(counted, trial_by_id),
        "rows": rows, "trial_count": len(trials), "best_trial": best_trial, "lineage": lineage,
        "progress": search,
        "all_trials": trials if len(shown) < len(trials) else None,
        "best_graph": graphs[best_trial.id] if best_trial else None,
        "resources": sampled.columns(), "sample_count": sampled.count,
        "start": segments[0].started_at if segments else 0.0,
        "nodes": nodes[:REPLICA_ROWS], "nodes_hidden": max(0, len(nodes) - REPLICA_ROWS),
        "segments": segments, "store": redact(rd.store_url(store_url) or "history.db"),
        "breakdown": breakdown, "breakdown_parts": BREAKDOWN_LABELS,
        "breakdown_rows": _fewest(breakdown["replicas"] if breakdown else [], _training_share),
        "node_rows": _fewest(described, lambda n: n.get("ceiling_ops") or 0.0),
        "all_replicas": (breakdown, described) if max(
            len(breakdown["replicas"]) if breakdown else 0, len(described),
            len(nodes)) > REPLICA_ROWS else None,
        "ceiling_precisions": sorted({c["precision"] for n in described
                                      for c in n.get("ceiling", [])}),
    }


def _training_share(row: dict[str, Any]) -> float:
    return float(row.get("training_s") or 0.0) / max(float(row.get("session_s") or 0.0), 1e-9)


def _fewest(rows: list[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    """All ``rows``, or past ``REPLICA_ROWS`` those lowest by ``key``, in their own order."""
    if len(rows) <= REPLICA_ROWS:
        return rows
    kept = {id(r) for r in sorted(rows, key=key)[:REPLICA_ROWS]}
    return [r for r in rows if id(r) in kept]


def shown_trials(trials: list[TrialRecord], lineage: list[int],
                 limit: int | None = None) -> list[TrialRecord]:
    """The trials the table lists: all of them, or in a long run the best model's lineage
    and the most accurate others, ``limit`` in all, by id. The whole list goes to trials.csv
    beside the report."""
    limit = TABLE_ROWS if limit is None else limit
    if len(trials) <= limit:
        return trials
    keep = set(lineage)
    ranked = sorted(trials, key=lambda t: -1.0 if t.best_accuracy is None else t.best_accuracy,
                    reverse=True)
    for t in ranked:
        if len(keep) >= limit:
            break
        keep.add(t.id)
    return [t for t in trials if t.id in keep]


def _thin(values: list[float], limit: int) -> list[float]:
    """At most ``limit`` of the sorted ``values``, evenly spread, always with the last."""
    if len(values) <= limit:
        return values
    step = len(values) / (limit - 1)
    return [values[int(i * step)] for i in range(limit - 1)] + [values[-1]]


def _score_curve(counted: list[tuple[float, EpochLike]], config: Config,
                 by_replica: list[Span] | None = None) -> list[dict[str, Any]]:
    """The score's own timeline, with a mark at every epoch end (in a long run, at
    ``CURVE_POINTS`` of them, evenly spread: more than a chart's width shows); charged per
    replica when ``by_replica`` gives the spans."""
    ends = _thin(sorted({t for t, _ in counted}), CURVE_POINTS)
    accuracy = config.data.dataset != "synthetic"
    if by_replica is not None:
        marks = replica_timeline(by_replica, ends[-1] if ends else 0.0, accuracy,
                                 marks_at=ends)[0]
    else:
        marks = timeline(counted, ends[-1] if ends else 0.0, accuracy, marks_at=ends)
    return [{"t": t, **m.to_dict()} for t, m in zip(ends, marks)]


def _accuracy_series(counted: list[tuple[float, EpochLike]],
                     trials: dict[int, TrialRecord]) -> list[dict[str, Any]]:
    """Each trial's (run time, validation accuracy) points."""
    series: dict[int, dict[str, Any]] = {}
    for t, e in counted:
        rec = trials[e.trial_id]
        series.setdefault(e.trial_id, {"id": rec.id, "parent": rec.parent_id,
                                       "replica": rec.replica_index, "points": []}
                          )["points"].append((t, e.val_accuracy))
    return list(series.values())


def _trial_rows(trials: list[TrialRecord],
                epochs: list[EpochRecord]) -> tuple[list[dict[str, Any]], dict[int, Graph]]:
    """A row of the trial table per trial, and each trial's graph."""
    epoch_time: dict[int, float] = {}
    for e in epochs:
        epoch_time[e.trial_id] = epoch_time.get(e.trial_id, 0.0) + e.ended_at - e.started_at
    rows = []
    graphs = {}
    for rec in trials:
        g = graphs[rec.id] = Graph.from_json(rec.graph_json)
        batch = rec.extra.get("batch_size") or rec.hparams.get("batch_size") or 1
        ops_count = count(g, batch_size=batch)
        rows.append({
            "id": rec.id, "parent": rec.parent_id, "replica": rec.replica_index, "round": rec.round,
            "morphs": _morph_text(rec.morphs), "depth": g.count("conv2d"),
            "params": ops_count.params, "ops_per_image": ops_count.total,
            "batch": batch, "kernel": rec.hparams.get("kernel_size"),
            "tpe": rec.hparams.get("tpe_trial") is not None, "epochs": rec.epochs_done,
            "best": rec.best_accuracy, "predicted": rec.predicted_accuracy,
            "status": rec.status, "reason": rec.reason,
            "seconds": epoch_time.get(rec.id, 0.0)})
    return rows, graphs


def render(data: dict[str, Any]) -> str:
    result = data["result"]
    resource_svg, resource_note = charts.resource_chart(data["resources"], data["start"])
    best_graph: Graph | None = data["best_graph"]
    best_ops = count(best_graph) if best_graph else None
    template = _env.get_template("report.html.j2")
    return template.render(
        d=data, r=result, version=__version__,
        generated=datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        score_svg=charts.score_chart(data["curve"], result.get("timeline", [])),
        error_svg=charts.error_chart(data["curve"]),
        trials_svg=charts.trials_chart(data["series"], [t["id"] for t in data["lineage"]]),
        resource_svg=resource_svg, resource_note=resource_note,
        progress_svg=charts.progress_chart(data["progress"]["whole"],
                                           data["progress"]["per_replica"],
                                           data["progress"]["end"]),
        lineage_svg=charts.lineage_chart(data["progress"]["lineage"],
                                         data["progress"]["siblings"]),
        ranking_svg=charts.ranking_chart(data["progress"]["ranking"].points),
        best_summary=layer_table(best_graph) if best_graph else None, best_ops=best_ops,
        kinds=best_ops.by_kind if best_ops else {})


TRIALS_CSV = "trials.csv"
CSV_COLUMNS = ("id", "parent", "replica", "round", "status", "epochs", "best_accuracy",
               "predicted_accuracy", "batch_size", "kernel_size", "morphs", "graph_hash", "reason")


def trials_csv(trials: list[TrialRecord]) -> str:
    """Every trial, one line each, for a run whose report lists only some."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for t in trials:
        writer.writerow([t.id, t.parent_id, t.replica_index, t.round, t.status, t.epochs_done,
                         t.best_accuracy, t.predicted_accuracy,
                         t.extra.get("batch_size") or t.hparams.get("batch_size"),
                         t.hparams.get("kernel_size"), _morph_text(t.morphs), t.graph_hash,
                         t.reason])
    return out.getvalue()


REPLICAS_CSV = "replicas.csv"


def replicas_csv(breakdown: dict[str, Any] | None, described: list[dict[str, Any]]) -> str:
    """Every replica, one line each (its node, devices, measured ceiling, and where its time
    went), for a run whose report lists only some."""
    parts = [key for key, _ in BREAKDOWN_LABELS] + ["session_s"]
    times = {row.get("replica"): row for row in (breakdown or {}).get("replicas", [])}
    nodes = {n.get("replica_index"): n for n in described}
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["replica", "host", "devices", "accelerators", "ceiling_ops",
                     "ceiling_error", *parts])
    for index in sorted(set(times) | set(nodes), key=lambda i: (i is None, i)):
        node, row = nodes.get(index, {}), times.get(index, {})
        accelerators = "; ".join(f"{a.get('name')} {a.get('uuid') or ''}".strip() for a in
                                 (node.get("system") or {}).get("accelerators", []))
        writer.writerow([index, node.get("host"), " ".join(map(str, node.get("devices", []))),
                         accelerators, node.get("ceiling_ops"), node.get("error"),
                         *[row.get(key) for key in parts]])
    return out.getvalue()


def render_records(run_dir: Path, records: RunRecords) -> str:
    """The report of the run at ``run_dir`` drawn from ``records`` (a bundle's exported
    records, read without a database)."""
    return render(_gather(RunDir(Path(run_dir)), records, None))


def write_report(run_dir: Path, store_url: str | None = None) -> Path:
    """report.html, and trials.csv (replicas.csv) where the report lists only some of the
    trials (replicas)."""
    rd = RunDir(Path(run_dir))
    data = gather(run_dir, store_url)
    if data["all_trials"] is not None:
        write_atomic(rd.path / TRIALS_CSV, trials_csv(data["all_trials"]))
    if data["all_replicas"] is not None:
        write_atomic(rd.path / REPLICAS_CSV, replicas_csv(*data["all_replicas"]))
    write_atomic(rd.report, render(data))
    return rd.report
