"""A run as seen from the login node while its job runs (``automlperf status RUN_DIR``): read
through the run's store service where it answers (the job's primary serves it), else from
the run's store and files (a finished or stopped run; a local run's SQLite file). What it
tells: the job and its end, the clock, the replicas by state, the trials and epochs, the
score so far and whether the result would be valid if the run ended now, the nodes that
staged the data and those that did not, and the health sweep's verdict.

Every figure comes from the run's own records, as `check` would recompute it: the score is
:func:`measure.score.score_run` of the epochs so far, the open session counted up to now.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from automlperf import rules
from automlperf.config import Config
from automlperf.measure.score import score_run
from automlperf.measure.units import format_ops
from automlperf.report.console import fmt_duration
from automlperf.runner import health
from automlperf.runner.staging import STAGING
from automlperf.store import Store, TrialStatus
from automlperf.store.rundir import RUN_FILE, RunDir, write_atomic
from automlperf.store.service.client import RemoteStore, service_file

# What a job's primary writes at each session's start: the batch job, its end, its nodes.
JOB_FILE = "job.json"
# How long a status waits for a store service that does not answer (a primary that died
# leaves its address behind): then it reads the store itself.
SERVICE_WAIT_S = 5.0
# A session whose primary has not touched it for this long is not running.
RUNNING_S = 60.0


def write_job(run_dir: Path, facts: dict[str, Any]) -> None:
    """Record the job a session runs in (``JOB_FILE``), for ``status``."""
    write_atomic(Path(run_dir) / JOB_FILE, json.dumps(facts, indent=1) + "\n")


def read_job(run_dir: Path) -> dict[str, Any]:
    try:
        found = json.loads((Path(run_dir) / JOB_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def staged_nodes(run_dir: Path) -> list[str]:
    """The nodes whose copy of the data is there now, by the staging records (a removed
    copy's record is kept under another name, with ``removed_at``)."""
    found = []
    for path in sorted((Path(run_dir) / STAGING).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "removed_at" not in record and record.get("node"):
            found.append(str(record["node"]))
    return found


@dataclass
class Status:
    """What ``automlperf status`` tells of a run (see the module's text)."""

    run_dir: str
    state: str  # running | stopped | finished | not started
    source: str  # where the records were read
    job: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    remaining_s: float = 0.0
    duration_s: float = 0.0
    deadline_at: float | None = None
    replicas: dict[str, int] = field(default_factory=dict)
    trials: dict[str, int] = field(default_factory=dict)
    epochs: int = 0
    score: float = 0.0
    best_accuracy: float | None = None
    valid_so_far: bool = False
    not_valid: list[str] = field(default_factory=list)  # "rule: detail", each rule broken
    simulated: bool = False
    staged: list[str] | None = None  # None: the run stages nothing
    unstaged: list[str] = field(default_factory=list)
    bad_nodes: dict[str, list[str]] = field(default_factory=dict)
    calls: int = 0  # store service calls this status made
    bytes_in: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def lines(self, now: float | None = None) -> list[str]:
        """The status as the command prints it, a fact a line."""
        now = time.time() if now is None else now
        shown = [f"{self.run_dir}: {self.state} ({self.source})"]
        job = self.job
        if job.get("job"):
            nodes = job.get("nodes") or []
            where = f" on {len(nodes)} node(s)" if nodes else ""
            ends = job.get("ends_at")
            end = (f", ends {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ends))} "
                   f"(in {fmt_duration(ends - now)})" if isinstance(ends, (int, float))
                   and ends > now else ", ended" if isinstance(ends, (int, float))
                   else ", no time limit known")
            shown.append(f"job       {job.get('scheduler', '?')} job {job['job']}{where}{end}")
        if self.state == "not started":
            return shown
        shown.append(f"clock     elapsed {fmt_duration(self.elapsed_s)} of "
                     f"{fmt_duration(self.duration_s)}, remaining "
                     f"{fmt_duration(self.remaining_s)}")
        shown.append("replicas  " + (", ".join(f"{n} {state}" for state, n in
                                                self.replicas.items()) or "none yet"))
        trials = ", ".join(f"{n} {status}" for status, n in self.trials.items()) or "none yet"
        shown.append(f"trials    {trials}; {self.epochs} epoch(s)")
        best = "-" if self.best_accuracy is None else f"{self.best_accuracy:.4f}"
        shown.append(f"score     {format_ops(self.score)} so far; best accuracy {best}"
                     + (" (SIMULATED: a model's figures)" if self.simulated else ""))
        verdict = "yes, so far" if self.valid_so_far else "no, so far: " + _briefly(self.not_valid)
        shown.append(f"valid     {verdict}")
        if self.staged is not None:
            nodes = len(self.staged) + len(self.unstaged)
            shown.append(f"staged    on {len(self.staged)} of {nodes} node(s)"
                         + (f"; reading the shared copy: {','.join(self.unstaged)}"
                            if self.unstaged else ""))
        if self.bad_nodes:
            shown.append(f"health    {len(self.bad_nodes)} node(s) cannot train: "
                         + "; ".join(f"{node} ({why[0]})" for node, why in self.bad_nodes.items()))
        return shown


def _briefly(broken: list[str]) -> str:
    """The rules broken, each once with its first detail ("fixed_setting: changed ... and 8
    more"): a run on other settings breaks one rule many times."""
    by_rule: dict[str, list[str]] = {}
    for item in broken:
        rule, _, detail = item.partition(": ")
        by_rule.setdefault(rule, []).append(detail)
    return "; ".join(f"{rule}: {details[0]}" + (f" and {len(details) - 1} more"
                                                 if len(details) > 1 else "")
                     for rule, details in by_rule.items())


def _open(run_dir: Path) -> tuple[Any, str, Any]:
    """(store, where it is read, what to close) for the run in ``run_dir``: its store
    service where it answers, else its own store."""
    from automlperf.store.base import StoreError

    found = service_file(run_dir)
    if found.exists():
        try:
            remote = RemoteStore(found, retry_s=SERVICE_WAIT_S)
            address = json.loads(found.read_text())
            return remote, f"store service at {address['host']}:{address['port']}", remote
        except (StoreError, OSError, ValueError, KeyError):
            pass  # a primary that ended left its address: read the store itself
    from automlperf.store.opening import run_store

    opened = run_store(run_dir)
    store = opened.__enter__()
    return store, "the run's store (no store service answers)", opened


def run_status(run_dir: Path, now: float | None = None) -> Status:
    """The status of the run in ``run_dir`` (see the module's text)."""
    run_dir = Path(run_dir).resolve()
    job = read_job(run_dir)
    if not (run_dir / RUN_FILE).exists():
        RunDir(run_dir)  # a folder that is no run at all is named as such below
        if not (run_dir / "automlperf.sbatch").exists() and not job:
            RunDir(run_dir).meta()  # raises: not a run directory
        return Status(str(run_dir), "not started", "no clock started yet", job=job)
    rd = RunDir(run_dir)
    run_id = int(rd.meta()["run_id"])
    store, source, closing = _open(run_dir)
    try:
        status = _read(store, run_id, run_dir, source, job, now)
        if isinstance(store, RemoteStore):
            status.calls = sum(store.calls.values())
            status.bytes_in = sum(store.bytes_in.values())
        return status
    finally:
        if isinstance(closing, RemoteStore):
            closing.close()
        else:
            closing.__exit__(None, None, None)


def _read(store: Store, run_id: int, run_dir: Path, source: str, job: dict[str, Any],
          now: float | None) -> Status:
    now = time.time() if now is None else now
    run = store.run(run_id)
    config = Config.parse(run["config"])
    system = run["system"]
    ruleset = rules.get(system.get("ruleset"))
    segments = store.segments(run_id)
    current = segments[-1] if segments else None
    # The primary touches its open session every second: one silent for a minute is gone
    # (killed with its job), whatever its record says.
    running = (current is not None and current.ended_at is None
               and now - current.last_seen < RUNNING_S)
    # The open session counted up to now: the score so far.
    counted = [replace(seg, last_seen=min(now, seg.deadline_at))
               if seg is current and running else seg for seg in segments]
    done = sum(min(s.end, s.deadline_at) - s.started_at for s in counted)
    epochs = store.epochs(run_id)
    by_status: Counter[str] = Counter()
    for t in store.tally(run_id):
        if t.count:
            by_status[str(t.status)] += t.count
    identity = system.get("dataset_identity") or {}
    official_data = (config.data.dataset == ruleset.dataset.name and not identity.get("problems")
                     and (not ruleset.proven_data or bool(identity.get("proof"))))
    scored = score_run(epochs, counted, dataset=config.data.dataset,
                       dataset_official=official_data,
                       fixed_changes=config.fixed_changes(ruleset),
                       accuracy_counts=config.data.dataset != "synthetic", ruleset=ruleset,
                       grace_s=config.deadline_grace(ruleset))
    broken = [f"{v['rule']}: {v['detail']}" for v in scored["violations"]
              # A run of an hour or more reaches the minimum by its end.
              if not (v["rule"] == "duration" and config.run.duration_s >= ruleset.min_duration_s)]
    if config.simulated:
        broken.insert(0, "simulated: simulated accelerators are never valid")
    replicas: Counter[str] = Counter()
    seen = {}
    for rep in store.replicas(run_id):
        if current is not None and rep.segment == current.index:
            seen[rep.index] = rep  # the latest registration of each index
    lease = config.run.lease_timeout_s
    for rep in seen.values():
        if rep.status == TrialStatus.RUNNING:
            replicas["silent" if now - rep.last_heartbeat > lease else "running"] += 1
        elif rep.status == TrialStatus.FAILED and rep.reason:
            replicas["retired"] += 1
        else:
            replicas[str(rep.status)] += 1
    state = "running" if running else ("finished" if done >= float(run["duration_s"]) - 1e-6
                                       else "stopped")
    staged = unstaged = None
    if (run_dir / STAGING).exists():
        staged = staged_nodes(run_dir)
        unstaged = [n for n in job.get("nodes", []) if n not in staged]
    bad = health.verdict(run_dir, job.get("nodes", []), job.get("job")) \
        if job.get("nodes") and health.records(run_dir, job.get("job")) else {}
    return Status(
        str(run_dir), state, source, job=job, elapsed_s=done,
        remaining_s=max(0.0, float(run["duration_s"]) - done), duration_s=float(run["duration_s"]),
        deadline_at=current.deadline_at if current is not None else None,
        replicas=dict(replicas), trials=dict(by_status), epochs=len(epochs),
        score=scored["score"], best_accuracy=scored["best_accuracy"],
        valid_so_far=not broken, not_valid=broken, simulated=config.simulated,
        staged=staged, unstaged=unstaged or [], bad_nodes=bad)
