"""MLPerf-style records of a run: ``mllog.txt`` (``:::MLLOG`` lines, written with the
``mlperf-logging`` package, an optional extra) and ``system_desc.json`` in MLPerf Training's
system description fields. Both are rebuilt from the store and the run's files, so they can
be written again at any time (``automlperf mlperf RUN_DIR``).

The whole AutoML run is one MLPerf "run": every counted epoch of every trial, in the order
they started, is an MLPerf epoch numbered from 0, and its validation accuracy is logged as
``eval_accuracy`` with the trial it belongs to.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

from automlperf.measure.score import counted_epochs
from automlperf.errors import UserError

MLLOG_FILE = "mllog.txt"
SYSTEM_DESC_FILE = "system_desc.json"
BENCHMARK = "automlperf"


class MlperfMissing(UserError, RuntimeError):
    """mlperf-logging is not installed."""


def rules_path() -> Path:
    """Our compliance rules for mllog.txt, for mlperf-logging's checker (--config)."""
    return Path(str(resources.files("automlperf") / "data" / "mllog_rules.yaml"))


def _logger(path: Path) -> Any:
    try:
        from mlperf_logging.mllog import mllog
    except ImportError:
        raise MlperfMissing("mllog.txt needs mlperf-logging: pip install 'automlperf[mlperf]'") \
            from None
    log = logging.getLogger(f"automlperf.mllog.{path}")
    log.propagate = False
    log.setLevel(logging.INFO)
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    return mllog.MLLogger(logger=log, default_stack_offset=1), handler


def _ms(t: float) -> int:
    return int(round(t * 1000))


def platform_name(system: dict[str, Any], nodes: int) -> str:
    accels = system.get("accelerators", [])
    if accels:
        return f"{nodes}x{system.get('host', '?')} ({len(accels)}x {accels[0]['name']})"
    return f"{nodes}x{system.get('host', '?')} (CPU)"


def write_mllog(path: Path, store: Any, run_id: int, result: dict[str, Any],
                system: dict[str, Any], org: str) -> Path:
    """Write the run's ``:::MLLOG`` lines to ``path`` from its store and result."""
    mllogger, handler = _logger(path)
    from mlperf_logging.mllog import constants as c

    run = store.run(run_id)
    segments = store.segments(run_id)
    grace = float((result.get("charging") or {}).get("grace_s") or 0.0)
    epochs: list[Any] = [e for _, e in counted_epochs(store.epochs(run_id), segments, grace)]
    counted = sorted(epochs, key=lambda e: (e.started_at, e.trial_id, e.epoch))
    trials = {t.id: t for t in store.summaries(run_id)}
    try:
        events: list[tuple[float, int, str, str, Any, dict[str, Any]]] = []

        def add(t: float, kind: str, key: str, value: Any = None, **meta: Any) -> None:
            events.append((t, len(events), kind, key, value, meta))

        created = float(run["created_at"])
        started = segments[0].started_at if segments else created
        ended = max((s.end for s in segments), default=started)
        for key, value in ((c.SUBMISSION_BENCHMARK, BENCHMARK), (c.SUBMISSION_ORG, org),
                           (c.SUBMISSION_DIVISION, c.CLOSED if result.get("official")
                            else c.OPEN),
                           # A model's figures are research, never a system on premises.
                           (c.SUBMISSION_STATUS,
                            c.RESEARCH if result.get("simulated") else c.ONPREM),
                           (c.SUBMISSION_PLATFORM,
                            platform_name(system, int(result.get("nodes") or 1)))):
            add(created, "event", key, value)
        if result.get("simulated"):
            add(created, "event", "automlperf_simulated", True, **(result.get("simulation") or {}))
        add(created, "start", c.INIT_START)
        if counted:
            add(created, "event", c.TRAIN_SAMPLES, counted[0].train_images)
            add(created, "event", c.EVAL_SAMPLES, counted[0].val_images)
        add(started, "end", c.INIT_STOP)
        add(started, "start", c.RUN_START)
        for number, e in enumerate(counted):
            trial = trials.get(e.trial_id)
            meta = {c.EPOCH_NUM: number, "trial_id": e.trial_id, "trial_epoch": e.epoch,
                    "replica": trial.replica_index if trial else None}
            add(e.started_at, "start", c.EPOCH_START, **meta)
            add(e.ended_at, "end", c.EPOCH_STOP, **meta)
            add(e.ended_at, "event", c.EVAL_ACCURACY, e.val_accuracy, **meta)
        add(ended, "event", "automlperf_score", result.get("score"),
            regulated_score=result.get("regulated_score"), total_ops=result.get("total_ops"))
        status = c.ABORTED if result.get("interrupted") or not counted else c.SUCCESS
        add(ended, "end", c.RUN_STOP, **{c.STATUS: status})
        events.sort(key=lambda ev: (ev[0], ev[1]))
        for t, _, kind, key, value, meta in events:
            log = {"start": mllogger.start, "end": mllogger.end, "event": mllogger.event}[kind]
            log(key=key, value=value, metadata=meta or None, time_ms=_ms(t))
    finally:
        handler.close()
    return path


def system_desc(system: dict[str, Any], result: dict[str, Any], org: str) -> dict[str, Any]:
    """MLPerf Training's system description fields (strings, as MLPerf's own files and
    checker have them), filled from system.json; what a
    machine cannot report about itself (cooling, interconnect topology) is left blank for
    the submitter, as MLPerf's own templates do."""
    accels = system.get("accelerators", [])
    cpu = system.get("cpu", {})
    software = system.get("software", {})
    nodes = int(result.get("nodes") or system.get("nodes") or 1)
    memory = accels[0].get("memory_gib") if accels else None
    stack = ", ".join(f"{k} {v}" for k, v in software.items()
                      if v and k not in ("torch", "python"))
    return {
        "submitter": org,
        "division": "closed" if result.get("official") else "open",
        # A simulated run's devices were modelled: nothing is available to run it on.
        "status": "Simulated (not a measurement)" if result.get("simulated")
        else "Available on-premise",
        "system_name": platform_name(system, nodes),
        "system_type": "datacenter",
        "system_type_detail": "",
        "number_of_nodes": str(nodes),
        "host_processors_per_node": "",
        "host_processor_model_name": cpu.get("model", ""),
        "host_processor_core_count": str(cpu.get("physical_cores") or ""),
        "host_processor_vcpu_count": str(cpu.get("logical_cores") or ""),
        "host_processor_frequency": "",
        "host_processor_caches": "",
        "host_processor_interconnect": "",
        "host_memory_capacity": f"{system.get('memory_gib')} GiB",
        "host_storage_type": "",
        "host_storage_capacity": "",
        "host_networking": "",
        "host_networking_topology": "",
        "host_memory_configuration": "",
        "accelerators_per_node": str(len(accels)),
        "accelerator_model_name": accels[0]["name"] if accels else "",
        "accelerator_host_interconnect": "",
        "accelerator_frequency": "",
        "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "",
        "accelerator_memory_capacity": f"{memory} GiB" if memory else "",
        "accelerator_interconnect": "",
        "accelerator_interconnect_topology": "",
        "cooling": "",
        "hw_notes": "",
        "framework": f"PyTorch {software.get('torch')}" if software.get("torch") else "",
        "other_software_stack": f"Python {software.get('python')}, {stack}".strip(", "),
        "operating_system": system.get("os", ""),
        "sw_notes": f"automlperf {result.get('automlperf_version')}",
    }


def read_system_desc(folder: Path) -> dict[str, Any]:
    """The system description in ``folder`` (a run directory or a bundle); empty if it has
    none, or none that reads."""
    try:
        data = json.loads((Path(folder) / SYSTEM_DESC_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_mlperf(run_dir: Path, store_url: str | None = None,
                 org: str = "unspecified") -> dict[str, Path | str]:
    """Write system_desc.json and (with mlperf-logging installed) mllog.txt into the run
    directory; what was written, or why mllog.txt was not."""
    from automlperf.measure.result import read_result
    from automlperf.store.opening import run_store
    from automlperf.store.rundir import RunDir, write_atomic

    rd = RunDir(Path(run_dir))
    result = read_result(rd.result)
    system = json.loads(rd.system.read_text()) if rd.system.exists() else {}
    out: dict[str, Path | str] = {}
    desc = rd.path / SYSTEM_DESC_FILE
    write_atomic(desc, json.dumps(system_desc(system, result, org), indent=1) + "\n")
    out["system_desc"] = desc
    try:
        with run_store(rd.path, store_url) as store:
            out["mllog"] = write_mllog(rd.path / MLLOG_FILE, store, int(rd.meta()["run_id"]),
                                       result, system, org)
    except MlperfMissing as exc:
        out["mllog"] = str(exc)
    return out
