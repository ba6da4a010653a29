"""The health sweep before the clock (``automlperf sweep``): one step over every node of the
job checks what a replica there needs, so that the nodes that cannot train are named up front,
and left out where the job asks (``automlperf slurm --exclude-bad-nodes``), instead of found
one retired replica at a time.

Each node checks its accelerators (as many as the job asked for, the driver's version, and
uncorrected ECC errors or failed row remapping where the driver tells), the staging folder
(there, not on a memory-backed file system, with room for the dataset; a folder on the root
file system is noted), the dataset (the official archives are there, and are the files the
run proved once a session proved them; the files a folder's index names are where the node
sees them) and the container image (readable there). It records what it found in
``RUN_DIR/health/<node>.json``; the batch host reads the records of its job
(:func:`verdict`), and a node that wrote none did not answer.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from automlperf.dataset.archive import NAMES, is_archive_folder
from automlperf.dataset.index import DatasetIdentityError, FileIndex, read_index_meta
from automlperf.dataset.shared import SHARED_INDEX, check_data_here
from automlperf.runner.staging import run_data_dir, staged_root
from automlperf.store.rundir import write_atomic

HEALTH = "health"
# What each node's sweep may take (the step's per-task timeout): NVML and a few stat calls.
SWEEP_S = 300
# File systems whose files live in memory: a staged copy there takes the training's memory.
MEMORY_BACKED = {"tmpfs", "ramfs"}
# The job asks the primary to leave out the nodes the sweep found bad (set by the script).
EXCLUDE_ENV = "AUTOMLPERF_EXCLUDE_BAD_NODES"
HEADROOM = 1.02  # the file system's own blocks beside the files' bytes (as staging counts)


def node_name(env: Mapping[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get("SLURMD_NODENAME") or socket.gethostname()


def job_id(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    for variable in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID"):
        if env.get(variable):
            return env[variable]
    return None


def gpu_facts() -> dict[str, Any]:
    """What this node's NVIDIA driver says of its GPUs (NVML): their count, the driver's
    version, and per GPU its uncorrected ECC errors since the driver loaded and its row
    remapping (None where the GPU does not tell). Without NVML, the device files are
    counted."""
    facts: dict[str, Any] = {"source": "device files",
                             "count": len(glob.glob("/dev/nvidia[0-9]*")), "devices": []}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVIDIA driver, or no NVML library
        facts["nvml"] = str(exc) or type(exc).__name__
        return facts
    try:
        facts.update(source="NVML", count=pynvml.nvmlDeviceGetCount(),
                     driver=_text(pynvml.nvmlSystemGetDriverVersion()))
        for i in range(facts["count"]):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            device: dict[str, Any] = {"index": i, "name": _text(pynvml.nvmlDeviceGetName(handle))}
            device["uncorrected_ecc"] = _asked(
                pynvml.nvmlDeviceGetTotalEccErrors, handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            remap = _asked(pynvml.nvmlDeviceGetRemappedRows, handle)
            if remap is not None:  # (corrected rows, uncorrected rows, pending, failed)
                device["remap_pending"], device["remap_failed"] = bool(remap[2]), bool(remap[3])
            facts["devices"].append(device)
    finally:
        pynvml.nvmlShutdown()
    return facts


def _asked(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED: the GPU does not tell
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def judge_accelerators(expected: int, facts: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the GPUs ``facts`` describes, for a job that asked for
    ``expected`` of them on each node."""
    problems: list[str] = []
    warnings: list[str] = []
    count = int(facts.get("count") or 0)
    if expected and count < expected:
        problems.append(f"{count} of the {expected} GPUs the job asked for are visible "
                        f"({facts.get('source')}" + (f": {facts['nvml']}" if facts.get("nvml")
                                                     else "") + ")")
    for device in facts.get("devices", []):
        which = f"GPU {device['index']}"
        if device.get("uncorrected_ecc"):
            problems.append(f"{which} has {device['uncorrected_ecc']} uncorrected ECC "
                            "error(s) since its driver loaded: drain the node, or reset the GPU")
        if device.get("remap_failed"):
            problems.append(f"{which} failed to remap a row of its memory: drain the node")
        elif device.get("remap_pending"):
            warnings.append(f"{which} has a memory row remapping pending (a GPU reset applies it)")
    return problems, warnings


def mount_of(path: Path, mounts: Sequence[tuple[str, str]] | None = None) -> tuple[str, str]:
    """(mount point, file system type) of the mount that holds ``path``: the deepest of
    ``mounts`` (this host's, from psutil, by default) whose point holds it."""
    if mounts is None:
        import psutil

        mounts = [(m.mountpoint, m.fstype) for m in psutil.disk_partitions(all=True)]
    real = Path(os.path.realpath(path))
    found = ("/", "")
    for point, fstype in mounts:
        where = Path(point)
        if (where == real or where in real.parents) and len(where.parts) >= len(Path(found[0]).parts):
            found = (point, fstype)
    return found


def check_stage_target(local: Path, need_bytes: int | None,
                       mounts: Sequence[tuple[str, str]] | None = None
                       ) -> tuple[dict[str, Any], list[str], list[str]]:
    """(facts, problems, warnings) of ``local`` as the folder a node stages the data to: it
    must be there (a missing mount would put the copy on the node's root file system), not
    in memory, and have room for ``need_bytes``."""
    problems: list[str] = []
    warnings: list[str] = []
    if not Path(local).is_dir():
        return ({"path": str(local)}, [f"the staging folder {local} is not there (its file "
                                       "system not mounted?)"], [])
    point, fstype = mount_of(Path(local), mounts)
    free = shutil.disk_usage(local).free
    facts = {"path": str(local), "mount": point, "fstype": fstype, "free_bytes": free}
    if fstype in MEMORY_BACKED:
        problems.append(f"the staging folder {local} is on {fstype} ({point}): the copy would "
                        "live in the memory training needs; give --stage-to a disk")
    if need_bytes is not None and need_bytes * HEADROOM > free:
        problems.append(f"the staging folder {local} has {free / 1e9:.2f} GB free and the "
                        f"dataset needs {need_bytes / 1e9:.2f} GB")
    if point == "/":
        warnings.append(f"the staging folder {local} is on the root file system, not a mount "
                        "of its own")
    return facts, problems, warnings


def check_data(run_dir: Path) -> list[str]:
    """The problems of the run's dataset as this node sees it (a few ``stat`` calls): the
    files the run's index names are where the node reads them, the archives the ones its
    sessions proved; before any session proved the archives, that they are there to read."""
    shared = Path(run_dir) / SHARED_INDEX
    try:
        if (shared / FileIndex.META).exists():
            check_data_here(shared, read_index_meta(shared)["root"])
            return []
    except DatasetIdentityError as exc:
        return [str(exc)]
    source = _data_dir(run_dir)
    if source is None or not is_archive_folder(source):
        return []
    missing = [name for name in NAMES.values() if not os.access(source / name, os.R_OK)]
    if missing:
        return [f"the dataset is not on this node ({', '.join(missing)} not readable in "
                f"{source}): make the archive folder reachable here, at the same path"]
    return []


def _data_dir(run_dir: Path) -> Path | None:
    try:
        return run_data_dir(run_dir)
    except (OSError, ValueError):
        return None


def stage_need(run_dir: Path, stage_to: Path, node: str) -> int | None:
    """The bytes this node's staging still has to write under ``stage_to``: the dataset's
    (the archives' sizes, or the folder index's bytes), less a copy kept there from an
    earlier job of the run (a chain's, a resubmission's), which staging reads again rather
    than copies; None where that is not known here (staging then checks the room itself)."""
    source = _data_dir(run_dir)
    target = staged_root(run_dir, stage_to, node)
    if source is not None and is_archive_folder(source):
        need = 0
        for name in NAMES.values():
            try:
                size = (source / name).stat().st_size
            except OSError:
                return None  # check_data names it
            try:
                kept = (target / name).stat().st_size
            except OSError:
                kept = -1
            need += 0 if kept == size else size
        return need
    shared = Path(run_dir) / SHARED_INDEX
    if not (shared / FileIndex.META).exists() or target.exists():
        return None  # a folder's kept copy is counted file by file, by staging
    try:
        return read_index_meta(shared).get("bytes")
    except DatasetIdentityError:
        return None


def check_image(run_dir: Path) -> list[str]:
    """The problems of the run's container image as this node sees it: an image file (a
    SIF, a .sqsh) must be readable here; an image named in a registry is left to the
    runtime."""
    from automlperf.runner.slurm import Container

    box = Container.load(Path(run_dir))
    if box is None or not box.image.startswith(("/", ".")):
        return []
    if not os.access(box.image, os.R_OK) or not os.path.isfile(box.image):
        return [f"the container image {box.image} is not readable here"]
    return []


def sweep(run_dir: Path, gpus: int = 0, stage_to: Path | None = None,
          env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Check this node (see the module's text) and record it in ``RUN_DIR/health``; the
    record."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    facts = gpu_facts()
    problems, warnings = judge_accelerators(gpus, facts)
    record: dict[str, Any] = {"node": node_name(env), "host": socket.gethostname(),
                              "job": job_id(env), "accelerators": facts}
    if stage_to is not None:
        staged, more, noted = check_stage_target(stage_to,
                                                 stage_need(run_dir, stage_to, record["node"]))
        record["stage_to"] = staged
        problems += more
        warnings += noted
    problems += check_data(run_dir)
    problems += check_image(run_dir)
    record.update(problems=problems, warnings=warnings,
                  sweep_s=round(time.perf_counter() - started, 3), at=time.time())
    path = run_dir / HEALTH / f"{record['node']}.json"
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return record


def records(run_dir: Path, job: str | None = None) -> dict[str, dict[str, Any]]:
    """The sweep's records in ``run_dir`` by node: of ``job`` only, where given."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((Path(run_dir) / HEALTH).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if job is None or record.get("job") == job:
            found[str(record.get("node", path.stem))] = record
    return found


def verdict(run_dir: Path, nodes: Sequence[str], job: str | None) -> dict[str, list[str]]:
    """The nodes of ``nodes`` that cannot train, each with why: its sweep's problems, or that
    it wrote no record for ``job`` (it did not answer the sweep)."""
    found = records(run_dir, job)
    bad: dict[str, list[str]] = {}
    for node in nodes:
        record = found.get(node)
        if record is None:
            bad[node] = ["no answer from the health sweep (see logs/sweep-*.log)"]
        elif record.get("problems"):
            bad[node] = list(record["problems"])
    return bad


def describe(bad: Mapping[str, list[str]], nodes: int, excluded: bool) -> list[str]:
    """What the job's log says of the sweep: one line, then one per bad node."""
    if not bad:
        return [f"health sweep: all {nodes} node(s) can train"]
    what = "left out of the run" if excluded else ("their replicas will retire; "
                                                   "--exclude-bad-nodes leaves them out")
    lines = [f"health sweep: {len(bad)} of {nodes} node(s) cannot train ({what}): "
             f"{','.join(bad)}"]
    lines += [f"  {node}: {'; '.join(why)}" for node, why in bad.items()]
    return lines


def slurm_verdict(run_dir: Path, env: Mapping[str, str] | None = None
                  ) -> tuple[list[str], dict[str, list[str]], bool]:
    """(the SLURM job's nodes, those that cannot train and why, whether to leave them out)
    in the batch script, after the sweep's step: they are left out where the job asks and
    some node is left."""
    from automlperf.runner.slurm import node_names

    env = os.environ if env is None else env
    nodes = node_names(env)[:int(env.get("SLURM_JOB_NUM_NODES", "0") or 0)]
    bad = verdict(run_dir, nodes, env.get("SLURM_JOB_ID"))
    return nodes, bad, bool(env.get(EXCLUDE_ENV)) and 0 < len(bad) < len(nodes)


def srun_nodes(nodes: Sequence[str], bad: Mapping[str, list[str]], exclude: bool) -> str:
    """The srun options of the steps before the clock: every node, or all but the bad."""
    if exclude:
        return f"--nodes={len(nodes) - len(bad)} --exclude={','.join(bad)}"
    return f"--nodes={len(nodes)}"
