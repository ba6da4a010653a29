"""result.json: the scored figures of a run, assembled from its store and files."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from automlperf import __version__
from automlperf.config import Config
from automlperf.measure.score import score_run
from automlperf.store import Store

RESULT_SCHEMA_VERSION = 1


def _input_and_classes(graph_json: str) -> tuple[list[int], int]:
    """A stored graph's input shape and class count, without rebuilding the graph: stored
    graphs list layers in topological order, so the last dense layer is the classifier."""
    data = json.loads(graph_json)
    dense = [layer for layer in data["layers"] if layer["kind"] == "dense"]
    return data["input_shape"], dense[-1]["out_channels"] if dense else 0


def dataset_is_official(config: Config, graph_jsons: list[str]) -> bool:
    """ImageNet-1k at 224x224: the trained graphs show what was actually fed."""
    if config.data.dataset != "imagenet" or not graph_jsons:
        return False
    return all(shape[1:] == [224, 224] and classes == 1000
               for shape, classes in map(_input_and_classes, graph_jsons))


def build_result(store: Store, run_id: int, config: Config, system: dict[str, Any],
                 interrupted: bool = False) -> dict[str, Any]:
    run = store.run(run_id)
    segments = store.segments(run_id)
    trials = store.trials(run_id)
    epochs = store.epochs(run_id)
    replicas = store.replicas(run_id)
    trained = [t.graph_json for t in trials if t.epochs_done]
    synthetic = config.data.dataset == "synthetic"
    scored = score_run(epochs, segments, dataset=config.data.dataset,
                       dataset_official=dataset_is_official(config, trained),
                       fixed_changes=config.fixed_changes(), accuracy_counts=not synthetic)
    if synthetic:
        scored["violations"].append({"rule": "accuracy", "detail": "synthetic data: throughput "
                                     "only, no accuracy-based score"})
    # A replica that gave up says why; such a run did not do its job.
    failures = [{"replica": rep.index, "host": rep.host, "reason": rep.reason}
                for rep in replicas if rep.status == "failed" and rep.reason]
    for f in failures:
        scored["violations"].append({"rule": "run_failed",
                                     "detail": f"replica {f['replica']}: {f['reason']}"})
    if failures:
        scored["valid"] = False
    devices = {}
    for rep in replicas:
        devices[(rep.host, rep.index)] = rep.devices
    device_count = sum(len(d) for d in devices.values())
    peak = system.get("peak_ops_per_node")
    nodes = len({host for host, _ in devices}) or 1
    total_peak = peak * nodes if peak else None
    status = Counter(t.status for t in trials)
    best = next((t for t in trials if t.id == scored["best_trial"]), None)
    return {
        "schema_version": RESULT_SCHEMA_VERSION,
        "generated_at": time.time(),
        "automlperf_version": __version__,
        "run_id": run_id,
        "name": run["name"],
        "dataset": config.data.dataset,
        **scored,
        "interrupted": interrupted,
        "failures": failures,
        "trials": len(trials),
        "trial_status": dict(sorted(status.items())),
        "best_trial_detail": None if best is None else {
            "id": best.id, "parent": best.parent_id, "replica": best.replica_index,
            "round": best.round, "hparams": best.hparams, "graph_hash": best.graph_hash},
        "replicas": len({rep.index for rep in replicas}),
        "devices": device_count,
        "nodes": nodes,
        "ops_per_s_per_device": scored["score"] / device_count if device_count else None,
        "peak_ops": total_peak,
        "fraction_of_peak": scored["score"] / total_peak if total_peak else None,
        "segments": [{"started_at": s.started_at, "ended_at": s.end,
                      "deadline_at": s.deadline_at} for s in segments],
        "started_at": segments[0].started_at if segments else run["created_at"],
        "duration_s": run["duration_s"],
        "system": {"host": system.get("host"), "cpu": system.get("cpu", {}).get("model"),
                   "accelerators": sorted({a["name"] for a in system.get("accelerators", [])})},
    }


def write_result(path: Path, result: dict[str, Any]) -> None:
    from automlperf.runner.rundir import write_atomic

    write_atomic(path, json.dumps(result, indent=1) + "\n")


def read_result(path: Path) -> dict[str, Any]:
    """A result.json of this or an earlier schema version."""
    data = json.loads(path.read_text())
    version = data.get("schema_version")
    if not isinstance(version, int) or version > RESULT_SCHEMA_VERSION:
        raise ValueError(f"{path}: result schema_version {version!r} is newer than this "
                         f"automlperf reads ({RESULT_SCHEMA_VERSION}); upgrade automlperf")
    return data
