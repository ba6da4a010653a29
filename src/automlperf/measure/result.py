"""result.json: the scored figures of a run, assembled from its store and files."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from automlperf import __version__, rules
from automlperf.config import Config
from automlperf.dataset.archive import NAMES
from automlperf.dataset.proof import CHANGED, judge, sessions
from automlperf.measure.breakdown import breakdown
from automlperf.measure.sample_reader import PendingDigest
from automlperf.measure import interference
from automlperf.measure.samples import SampleDigest
from automlperf.measure.score import NodeCeiling, ceiling_violations, score_run
from automlperf.measure.system import peak_for
from automlperf.store import EpochRecord, TrialRecord, TrialStatus
from automlperf.store.base import RunRecords

RESULT_SCHEMA_VERSION = 1


def _input_and_classes(graph_json: str) -> tuple[list[int], int]:
    """A stored graph's input shape and class count, without rebuilding the graph: stored
    graphs list layers in topological order, so the last dense layer is the classifier."""
    data = json.loads(graph_json)
    dense = [layer for layer in data["layers"] if layer["kind"] == "dense"]
    return data["input_shape"], dense[-1]["out_channels"] if dense else 0


def dataset_is_official(config: Config, graph_jsons: list[str],
                        identity: dict[str, Any] | None = None,
                        ruleset: rules.Ruleset = rules.CURRENT,
                        system: dict[str, Any] | None = None) -> tuple[bool, str | None]:
    """(official, why not): the data was identified as the ruleset's dataset when the run
    started (from aiperf-2021.4, every session read the official archives and proved them:
    ``system`` holds the sessions' records, dataset/proof.py ``judge``), and the trained
    graphs show it was fed at the official size."""
    ds = ruleset.dataset
    if config.data.dataset != ds.name:
        return False, None
    if identity is None:
        return False, "the data was not identified"
    if identity.get("problems"):
        return False, "; ".join(identity["problems"])
    if ruleset.proven_data and not identity.get("proof"):
        return False, "the data's content was not proven against the official archives"
    if ruleset.archive_proof:
        why = judge(system if system is not None else {"dataset_identity": identity}, ruleset)
        if why is not None:
            return False, why
    if not graph_jsons:
        return False, "no trial completed an epoch"
    size = [ds.image_size, ds.image_size]
    if not all(shape[1:] == size and classes == ds.num_classes
               for shape, classes in map(_input_and_classes, graph_jsons)):
        return False, f"the trained graphs were not fed {ds.image_size}x{ds.image_size} images"
    return True, None


def latest_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each replica's most recent node description (a resumed run measures again)."""
    latest: dict[int, dict[str, Any]] = {}
    for node in nodes:
        latest[node["replica_index"]] = node
    return [latest[k] for k in sorted(latest)]


def owned_peak(node: dict[str, Any]) -> float | None:
    """Sum of the cited peaks of the accelerators this replica trained on."""
    accel = {f"{a.get('type', 'cuda')}:{a['index']}": a
             for a in node.get("system", {}).get("accelerators", [])}
    peaks = [accel[d].get("peak_ops") for d in node.get("devices", []) if d in accel]
    return sum(p for p in peaks if p) if peaks and all(peaks) else None


def cited_peak(node: dict[str, Any]) -> float | None:
    """The data-sheet peak of the accelerators this replica trained on, from their names
    (``peak_for``), not from the peak the node recorded; None where any is not known."""
    accel = {f"{a.get('type', 'cuda')}:{a.get('index')}": a
             for a in (node.get("system") or {}).get("accelerators", [])}
    devices = [d for d in node.get("devices") or [] if d != "cpu"]
    found = [peak_for(str(accel[d].get("name") or "")) if d in accel else None for d in devices]
    if not devices or not all(found):
        return None
    return sum(f[0] for f in found if f)


def node_ceiling(node: dict[str, Any]) -> NodeCeiling:
    """What the implausibility bound reads of a node's description."""
    return NodeCeiling(replica=int(node.get("replica_index") or 0),
                       host=str(node.get("host") or "?"), ceiling_ops=node.get("ceiling_ops"),
                       accelerator=any(d != "cpu" for d in node.get("devices") or []),
                       peak_ops=cited_peak(node), error=node.get("error"))


def simulation_of(config: Config) -> dict[str, Any] | None:
    """What a simulated run modelled (None for a measured run)."""
    if not config.simulated:
        return None
    sim = config.simulation
    return {"sustained_ops_per_device": sim.sustained_ops,
            "time_compression": sim.time_compression, "device_memory_gib": sim.memory_gib}


def simulated_detail(simulation: dict[str, Any]) -> str:
    return (f"simulated accelerators ({simulation['sustained_ops_per_device']:.3g} OPS sustained "
            f"per device, time compressed {simulation['time_compression']:g}x): every figure "
            "is a model's, not a measurement")


def build_result(store: RunRecords, run_id: int, config: Config, system: dict[str, Any],
                 interrupted: bool = False, trials: list[TrialRecord] | None = None,
                 epochs: list[EpochRecord] | None = None,
                 sampled: SampleDigest | None = None) -> dict[str, Any]:
    """The result of the run in ``store``; ``trials``, ``epochs`` and the samples'
    ``sampled`` digest, when given, are the run's as just read from it (a long run's are
    large: each is read once)."""
    run = store.run(run_id)
    segments = store.segments(run_id)
    # A long run's samples are read in other processes meanwhile.
    pending = None if sampled is not None else PendingDigest(store, run_id, segments)
    trials = store.trials(run_id) if trials is None else trials
    epochs = store.epochs(run_id) if epochs is None else epochs
    replicas = store.replicas(run_id)
    trained = [t.graph_json for t in trials if t.epochs_done]
    synthetic = config.data.dataset == "synthetic"
    recorded = run["system"]  # what the run recorded in its store when it was created
    ruleset = rules.get(recorded.get("ruleset"))
    identity = recorded.get("dataset_identity")
    official_data, why = dataset_is_official(config, trained, identity, ruleset, recorded)
    replica_of = {t.id: t.replica_index for t in trials}
    grace = config.deadline_grace(ruleset)
    scored = score_run(epochs, segments, dataset=config.data.dataset,
                       dataset_official=official_data, dataset_detail=why,
                       fixed_changes=config.fixed_changes(ruleset), accuracy_counts=not synthetic,
                       ruleset=ruleset, replica_of=replica_of, grace_s=grace,
                       duration_s=run["duration_s"])
    simulation = simulation_of(config)
    failures, retired = replica_outcomes(replicas)
    nodes_seen = store.nodes(run_id)
    described = latest_nodes(nodes_seen)
    # A simulated run measured nothing, and is never valid: no bound is held to it.
    bound = (None if simulation is not None else
             ceiling_bound(scored["score"], described, replicas, trials, ruleset))
    judge_run(scored, synthetic=synthetic, simulation=simulation, failures=failures,
              changed=data_changes(recorded, retired + failures, nodes_seen), bound=bound)
    devices = {(rep.host, rep.index): rep.devices for rep in replicas}
    device_count = sum(len(d) for d in devices.values())
    nodes = len({host for host, _ in devices}) or 1
    total_peak, ceiling, ceiling_end = node_totals(described, system, nodes)
    if pending is not None:
        sampled = pending.result()
    assert sampled is not None
    # A simulated run's devices drew no power of this machine (its sampler reads none).
    energy = {} if simulation is not None else sampled.energy() or {}
    power = energy.get("mean_power_w")
    status = Counter(t.status for t in trials)
    best = next((t for t in trials if t.id == scored["best_trial"]), None)
    # The primary's host as the run recorded it at its creation (a resumed run's primary may
    # run elsewhere), which system.json and `check` hold the result to.
    if recorded.get("host"):
        system = recorded
    accelerators = {a["name"] for a in system.get("accelerators", [])}
    accelerators |= {a["name"] for n in described
                     for a in n.get("system", {}).get("accelerators", [])}
    return {
        "schema_version": RESULT_SCHEMA_VERSION,
        "generated_at": time.time(),
        "automlperf_version": __version__,
        "run_id": run_id,
        "name": run["name"],
        "simulated": simulation is not None,
        "simulation": simulation,
        "dataset": config.data.dataset,
        **scored,
        "interrupted": interrupted,
        "failures": failures,
        "retired": retired,
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
        "ceiling_ops": ceiling,
        "fraction_of_ceiling": scored["score"] / ceiling if ceiling else None,
        "time_breakdown": breakdown(epochs, trials, segments, used=sampled.utilisation(),
                                    grace_s=grace),
        "decoding": decoding(epochs, trials),
        # The nodes' own while the run ran? The host's steal, GPU clocks held down, and the
        # ceiling measured again at the end (measure/interference.py).
        "interference": interference.judge(sampled.interference(), ceiling, ceiling_end),
        "dataset_identity": identity,
        "data_sources": data_sources(described),
        "provenance": recorded.get("provenance"),
        "node_descriptions": described,
        # Measured energy (GPU counters and CPU packages where readable) and the score per
        # watt of mean power over the same samples; None where nothing was measured.
        "energy_j": energy.get("energy_j"),
        "gpu_energy_j": energy.get("gpu_energy_j"),
        "cpu_energy_j": energy.get("cpu_energy_j"),
        "mean_power_w": power,
        "ops_per_watt": scored["score"] / power if power else None,
        "segments": [{"started_at": s.started_at, "ended_at": s.end,
                      "deadline_at": s.deadline_at} for s in segments],
        "started_at": segments[0].started_at if segments else run["created_at"],
        "duration_s": run["duration_s"],
        # A run extended after it ran (runner/extension.py): from what, to what, when.
        "extensions": system.get("extensions", []),
        "system": {"host": system.get("host"), "cpu": system.get("cpu", {}).get("model"),
                   "accelerators": sorted(accelerators)},
    }


def replica_outcomes(replicas: Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(failures, retired): a replica that gave up says why. Beside replicas of its session
    that went on, it was retired (a sick node costs its replica only); when every replica of
    a session gave up, the run did not do its job."""
    failures: list[dict[str, Any]] = []
    retired: list[dict[str, Any]] = []
    for rep in replicas:
        if rep.status == TrialStatus.FAILED and rep.reason:
            went_on = any(other.segment == rep.segment and other.status == TrialStatus.STOPPED
                          for other in replicas)
            (retired if went_on else failures).append(
                {"replica": rep.index, "host": rep.host, "reason": rep.reason})
    return failures, retired


def ceiling_bound(score: float, described: list[dict[str, Any]], replicas: Sequence[Any],
                  trials: Sequence[TrialRecord], ruleset: rules.Ruleset) -> list[dict[str, Any]]:
    """The violations of the implausibility bound: the score above what the nodes' ceilings
    allow, or a node that trained with no ceiling where the ruleset wants one."""
    bounded = [node_ceiling(n) for n in described]
    if ruleset.ceiling_required:
        # A replica that trained without describing its node has no ceiling either.
        seen = {b.replica for b in bounded}
        hosts = {rep.index: rep.host for rep in replicas}
        bounded += [NodeCeiling(replica=i, host=hosts.get(i, "?"), ceiling_ops=None,
                                accelerator=False, error="it recorded no node description")
                    for i in sorted({t.replica_index for t in trials if t.epochs_done} - seen)]
    return ceiling_violations(score, bounded, ruleset)


def judge_run(scored: dict[str, Any], *, synthetic: bool, simulation: dict[str, Any] | None,
              failures: list[dict[str, Any]], changed: list[str],
              bound: list[dict[str, Any]] | None) -> None:
    """Add to ``scored`` what else makes the run less than official: its data, a model of a
    machine, replicas that failed, data that changed, the ceiling's bound (None: not held)."""
    violations = scored["violations"]
    if synthetic:
        violations.append({"rule": "accuracy", "detail": "synthetic data: throughput only, "
                           "no accuracy-based score"})
    if simulation is not None:
        # A model of a machine never passes for a measurement of one.
        violations.insert(0, {"rule": "simulated", "detail": simulated_detail(simulation)})
        scored["official"] = scored["valid"] = False
    violations += [{"rule": "run_failed", "detail": f"replica {f['replica']}: {f['reason']}"}
                   for f in failures]
    if failures:
        scored["valid"] = False
    if changed:
        # The data a replica read was not what its session proved: whatever it trained on
        # is not the run's dataset.
        violations.append({"rule": "data_changed", "detail": "; ".join(changed)})
        scored["valid"] = scored["official"] = False
    if bound is not None:
        violations += bound
        scored["valid"] = scored["valid"] and not bound


def node_totals(described: list[dict[str, Any]], system: dict[str, Any],
                nodes: int) -> tuple[float | None, float | None, float | None]:
    """The run's peak, its ceiling and its ceiling again at the end: the sums over its
    nodes' descriptions, None where any node lacks one."""
    if not described:  # a run from before nodes described themselves
        peak = system.get("peak_ops_per_node")
        return (peak * nodes if peak else None), None, None

    def total(values: list[float | None]) -> float | None:
        return sum(v for v in values if v) if all(values) else None

    return (total([owned_peak(n) for n in described]),
            total([n.get("ceiling_ops") for n in described]),
            total([n.get("ceiling_end_ops") for n in described]))


def data_changes(system: dict[str, Any], gave_up: list[dict[str, Any]],
                 nodes: list[dict[str, Any]]) -> list[str]:
    """Where the data a replica read was not the data its session proved: an archive changed
    during a session (the primary looked again at its end), a replica or rank that found one
    changed when it opened it, a replica whose recorded archives no session proved, or one
    that read a staged copy it did not itself hash to the proven MD5s (runner/stagecheck.py)."""
    out = [line for s in sessions(system) for line in (s.get("proof") or {}).get("changed", [])]
    out += [f"replica {g['replica']} ({g['host']}): {g['reason']}" for g in gave_up
            if CHANGED in g["reason"]]
    proven: dict[str, set[str]] = {}
    files: dict[str, set[tuple[Any, ...]]] = {}
    for s in sessions(system):
        for part, archive in ((s.get("proof") or {}).get("archives") or {}).items():
            proven.setdefault(part, set()).add(archive.get("md5"))
            files.setdefault(part, set()).add(_file(archive))
    for node in nodes:
        data = node.get("data") or {}
        who = f"replica {node.get('replica_index')} ({node.get('host')})"
        for part, seen in (data.get("archives") or {}).items():
            if seen.get("md5") not in proven.get(part, set()):
                out.append(f"{who} read {seen.get('name')} with MD5 {seen.get('md5')}, which no "
                           "session of the run proved")
            elif data.get("source") == "shared" and _file(seen) not in files.get(part, set()):
                out.append(f"{who} read a shared {seen.get('name')} that is not the file any "
                           "session of the run proved (its size, inode or times differ)")
    # A replica describes its node several times a session, its own MD5s of a staged copy
    # in the last: each replica's last description of each session is judged.
    last = {(n.get("replica_index"), n.get("segment")): n for n in nodes}
    for node in last.values():
        data = node.get("data") or {}
        if data.get("source") == "staged" and data.get("archives"):
            who = f"replica {node.get('replica_index')} ({node.get('host')})"
            out += _staged_unproven(who, data, proven)
    return out


def _staged_unproven(who: str, data: dict[str, Any], proven: dict[str, set[str]]) -> list[str]:
    """Where a copy staged on a node was not proven by its replica's own hashing during the
    session (runner/stagecheck.py): staging's record of its MD5s is a file, never a proof."""
    computed = data.get("computed")
    if not isinstance(computed, dict):
        why = data.get("computed_error") or "not finished by the session's end"
        return [f"{who} read the archives staged on its node, which it did not hash during its "
                f"session ({why}): a staging record is no proof"]
    return [f"{who} read a staged {NAMES[part]} whose MD5, computed during its session, is "
            f"{computed.get(part)}, which no session of the run proved"
            for part in NAMES if computed.get(part) not in proven.get(part, set())]


def _file(archive: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(archive.get(k) for k in ("size", "inode", "mtime_ns", "ctime_ns"))


def data_sources(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """How many replicas read a copy staged on their node and how many the shared one (each
    replica's latest description; replicas of folders and built-in data count as neither)."""
    count = Counter(str((n.get("data") or {}).get("source")) for n in nodes
                    if (n.get("data") or {}).get("source"))
    return {"staged": count.get("staged", 0), "shared": count.get("shared", 0)}


def decoding(epochs: list[EpochRecord], trials: Sequence[TrialRecord] = ()) -> dict[str, Any]:
    """How the epochs ran: epochs per decode path (what decoded the images, with its
    libraries' versions), the images a GPU path left to the CPU reference, and the epochs
    trained through torch.compile; and, where the trials recorded it, why their path was
    chosen (trials per reason: a setting, or the doctor's measurement on the node)."""
    paths = Counter(e.decode_path for e in epochs if e.decode_path)
    out: dict[str, Any] = {"paths": dict(sorted(paths.items())),
           "cpu_decoded_images": sum(e.cpu_decoded for e in epochs),
           "compiled_epochs": sum(1 for e in epochs if e.compiled)}
    why = Counter(str(t.extra["decode_path"]) for t in trials if t.extra.get("decode_path"))
    if why:  # absent from results of runs whose trials did not record it
        out["chosen"] = dict(sorted(why.items()))
    return out


def write_result(path: Path, result: dict[str, Any]) -> None:
    from automlperf.store.rundir import write_atomic

    write_atomic(path, json.dumps(result, indent=1) + "\n")


def read_result(path: Path) -> dict[str, Any]:
    """A result.json of this or an earlier schema version."""
    data = json.loads(path.read_text())
    version = data.get("schema_version")
    if not isinstance(version, int) or version > RESULT_SCHEMA_VERSION:
        raise ValueError(f"{path}: result schema_version {version!r} is newer than this "
                         f"automlperf reads ({RESULT_SCHEMA_VERSION}); upgrade automlperf")
    return data
