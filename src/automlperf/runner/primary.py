"""The primary: the process of ``automlperf run``, which holds a whole benchmark run. It
chooses the launcher, then takes one session's steps (runner/session.py: prepare the run
directory, supervise the replicas to the deadline, finish with the result), and writes the
MLPerf-style logs and the report."""

from __future__ import annotations

import datetime
import errno
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from automlperf.config import Config, ConfigError, parse_duration
from automlperf.errors import INTERRUPTED, Resumable, UserError
from automlperf.events import TrialStatus
from automlperf.report.console import fmt_duration
from automlperf.runner import dataproof
from automlperf.runner import session as steps
from automlperf.runner.joblimits import batch_job_limit, record_finish
from automlperf.runner.launch import process_started_at
from automlperf.runner.slurm import Container, SlurmLauncher
from automlperf.runner.status import write_job
from automlperf.store.pgowner import batch_job
from automlperf.settings import check_cluster_task, settings_from_options
from automlperf.store.base import StoreError
from automlperf.store.connections import check_open_files, check_room
from automlperf.store.opening import served
from automlperf.store.rundir import UNWRITABLE, RunDir
from automlperf.store.urls import normalise_url, resolve_store_url

LAUNCHERS = ("local", "slurm", "external")


@dataclass(kw_only=True)
class RunRequest:
    """What ``automlperf run`` was asked; None leaves a setting to the configuration."""

    config: Path | None = None
    duration: str | None = None
    dataset: str | None = None
    data_dir: Path | None = None
    replicas: int | None = None
    devices_per_replica: int | None = None
    run_dir: Path | None = None
    store: str | None = None
    resume: bool = False
    launcher: str = "local"
    unofficial: bool = False  # run on data or settings an official run refuses, as unofficial
    small_task: bool = False  # the built-in or digits task on several nodes, asked for


@dataclass(kw_only=True)
class RunOutcome:
    """How a run ended and what it wrote."""

    run_dir: Path
    state: str  # completed | interrupted | failed (see steps.Watch)
    reason: str
    result: dict[str, Any]
    result_path: Path
    replicas: int
    joined: int | None  # replicas that joined, for a site's own launcher
    written: dict[str, Path] = field(default_factory=dict)  # mllog, system_desc, report
    problems: list[str] = field(default_factory=list)  # what could not be written, and why
    chain_link: bool = False  # a job of a chain ran it: the chain's next job goes on

    @property
    def exit_code(self) -> int:
        if self.state == "failed":
            return 1
        if self.state == "interrupted":
            return INTERRUPTED
        if self.joined == 0:
            return 1  # a session no replica joined measured nothing
        return 0


def _config(req: RunRequest) -> Config | None:
    """The configuration of a new run; None for a resumed one, which keeps its own."""
    if req.resume:
        if req.run_dir is None:
            raise UserError("--resume needs the --run-dir of the run to continue")
        if req.config is not None or req.dataset is not None:
            raise UserError("a resumed run keeps its configuration: drop --config and "
                            "--dataset (--duration extends it to that length)")
        return None
    return settings_from_options(req.config, req.dataset, duration=req.duration,
                                 data_dir=req.data_dir, unofficial=req.unofficial,
                                 options={"run.replicas": req.replicas,
                                          "run.devices_per_replica": req.devices_per_replica})


def _launcher(req: RunRequest, run_dir: Path, url: str | None, cfg: Config,
              excluded: list[str] | None = None) -> tuple[Any, int]:
    """The launcher asked for and the replicas it starts (a SLURM job's nodes but the
    ``excluded``)."""
    from automlperf.hardware import cores_available
    from automlperf.runner.launch import ExternalLauncher, LocalLauncher

    if req.launcher == "slurm":
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "0"))
        return SlurmLauncher(run_dir, url, excluded=list(excluded or [])), \
            nodes - len(excluded or [])
    count = req.replicas or cfg.run.replicas
    if req.launcher == "local":
        return LocalLauncher(run_dir, count, url,
                             req.devices_per_replica or cfg.run.devices_per_replica,
                             cores=cores_available(), simulated=cfg.simulated), count
    if req.launcher == "external":
        return ExternalLauncher(run_dir, count, url,
                                lease_timeout_s=cfg.run.lease_timeout_s), count
    raise UserError(f"--launcher must be {', '.join(LAUNCHERS[:-1])} or {LAUNCHERS[-1]}, "
                    f"not {req.launcher!r}")


def _swept(run_dir: Path, console: Console) -> tuple[list[str], list[str]]:
    """(this SLURM job's nodes, those to leave out): the health sweep's verdict on the
    nodes, told in the job's log; bad nodes are left out where the job asks (and some node
    is left)."""
    from automlperf.runner import health
    from automlperf.runner.slurm import node_names

    if not os.environ.get("SLURM_JOB_NODELIST"):
        return [], []
    if not health.records(run_dir, os.environ.get("SLURM_JOB_ID")):
        # No sweep ran in this job.
        return node_names()[:int(os.environ.get("SLURM_JOB_NUM_NODES", "0"))], []
    nodes, bad, exclude = health.slurm_verdict(run_dir)
    for line in health.describe(bad, len(nodes), exclude):
        console.print(line, highlight=False, soft_wrap=True)
    return nodes, list(bad) if exclude else []


def _staged(run_dir: Path, nodes: list[str]) -> tuple[int, int] | None:
    """(nodes that staged the data, nodes) where the run stages it."""
    from automlperf.runner.status import staged_nodes

    if not (run_dir / "staging").exists():
        return None
    staged = staged_nodes(run_dir)
    return len([n for n in nodes if n in staged] if nodes else staged), len(nodes) or len(staged)


def _startup_line(startup: dict[str, Any]) -> str:
    parts = [f"imports {startup['imports_s']:.1f} s", f"system description "
             f"{startup['describe_s']:.1f} s"]
    if "data_proof_s" in startup:
        parts.append(f"the archives' MD5s and index {startup['data_proof_s']:.1f} s "
                     f"({startup['data_proof_mb_s']:.0f} MB/s)")
    elif "dataset_index" in startup:
        parts.append(f"dataset index {startup['dataset_index']} ({startup['dataset_scan_s']:.1f} s "
                     f"walk{' at its scan' if startup['dataset_index'] == 'loaded' else ''})")
    return (f"start-up before the clock: {startup.get('before_clock_s', 0):.1f} s ("
            + ", ".join(parts) + ")")


def simulated_system(cfg: Config) -> list[dict[str, Any]] | None:
    """The simulated devices of one node of a simulated run (None for a real run)."""
    if not cfg.simulated:
        return None
    from automlperf.train.simulated import describe_devices

    return describe_devices(cfg.simulation, cfg.run.devices_per_replica or 1)


def run_benchmark(req: RunRequest, console: Console) -> RunOutcome:
    """Run (or resume) a benchmark to its deadline, Ctrl-C or SIGTERM, and write its result;
    progress goes to ``console``."""
    from automlperf.measure.system import describe

    cfg = _config(req)
    extend_to = None
    if req.resume and req.duration:
        try:
            extend_to = parse_duration(req.duration)
        except ConfigError as exc:
            raise ConfigError(f"--duration: {exc}") from None
    run_dir = req.run_dir
    if run_dir is None:
        run_dir = Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    url = resolve_store_url(req.store)
    replica_url = RunDir(run_dir).store_url(url) if req.resume else url
    # The launcher first: a request that does not fit the machine is refused before anything
    # is written.
    planned = Config.load(RunDir(run_dir).config) if cfg is None else cfg
    # The health sweep's verdict (the batch script's step before this one): the nodes that
    # cannot train, named here, and left out where the job asks.
    nodes, excluded = _swept(run_dir, console) if req.launcher == "slurm" else ([], [])
    starter, count = _launcher(req, run_dir, replica_url, planned, excluded)
    # The archives' proof, the longest part of the start-up, runs beside the rest of it.
    proving = dataproof.begin(planned)
    if cfg is not None and req.launcher != "local":
        check_cluster_task(cfg, count, req.small_task)
    # A store that would refuse the replicas connections says so now, not mid-run.
    check_room(normalise_url(replica_url) if replica_url else None, count)
    if served(replica_url):
        check_open_files(count)
    # An external launcher may place several replicas on a node: result.json counts the
    # nodes from the hosts that replicas report.
    described = time.time()
    system = describe(nodes=count if req.launcher == "slurm" else 1,
                      simulated=simulated_system(planned))
    # How long this process took to reach its clock, part by part: a job's time limit must
    # hold it besides the run's duration (docs/cluster.md, "Running on a cluster").
    started = process_started_at()
    system["startup"] = {"imports_s": round(described - started, 3),
                         "describe_s": round(time.time() - described, 3)}
    # A job on a cluster (not a laptop's local replicas) starts no clock it could not hold.
    limit = batch_job_limit(process_start=started) if req.launcher != "local" else None
    if limit is not None:
        system["job_limit"] = limit.describe()
    box = Container.load(run_dir) if req.launcher == "slurm" and not req.resume else None
    if box is not None:
        system["replica_image"] = box.record()  # the primary's provenance is the host's
    session = steps.prepare(cfg, run_dir, url, req.resume, system, limit=limit,
                            process_start=started, listen_all=req.launcher != "local",
                            extend_to=extend_to, proving=proving)
    scheduler, job = batch_job()
    write_job(run_dir, {"scheduler": scheduler, "job": job, "host": socket.gethostname(),
                        "primary_pid": os.getpid(), "segment": session.segment,
                        "started_at": limit.started_at if limit else None,
                        "ends_at": limit.ends_at if limit else None, "nodes": nodes,
                        "excluded": excluded, "replicas": count})
    session.context = {"job_ends_at": limit.ends_at if limit else None,
                       "staged": _staged(run_dir, nodes), "nodes": len(nodes) or count}
    if limit is not None and limit.chain_link and session.deadline_at > limit.must_end_by:
        console.print(f"this job of a chain holds {limit.must_end_by - session.started_at:.0f} s "
                      f"of the {session.deadline_at - session.started_at:.0f} s left: the "
                      "chain's next job goes on from where its time limit stops it",
                      highlight=False)
    if session.extended:
        console.print(f"the run now lasts {fmt_duration(float(extend_to or 0))}: "
                      f"{fmt_duration(session.deadline_at - session.started_at)} more",
                      highlight=False)
    elif extend_to is not None:
        console.print(f"the run already lasts {fmt_duration(extend_to)} (an earlier job "
                      "extended it)", highlight=False)
    try:
        outcome = _run_session(req, session, starter, console, system, run_dir, url, count)
        outcome.chain_link = limit is not None and limit.chain_link
        return outcome
    finally:
        session.stop_service()


def _run_session(req: RunRequest, session: steps.Session, starter: Any, console: Console,
                 system: dict[str, Any], run_dir: Path, url: str | None,
                 count: int) -> RunOutcome:
    cfg = session.config
    if session.deadline_at <= session.started_at:
        console.print("this run has used its whole duration; recomputing its result")
    # Official: every rule was checked before the clock (settings, and the data's identity).
    mode = "official run" if cfg.strict() else "unofficial"
    if cfg.simulated:
        mode = "SIMULATED accelerators: never official"
    startup = session.startup
    if startup:
        console.print(_startup_line(startup), highlight=False, soft_wrap=True)
    console.print(f"automlperf {'resuming' if req.resume else 'starting'} {run_dir}: "
                  f"{cfg.data.dataset}, {cfg.model.seed_model} seed, {count} replica(s), "
                  f"{fmt_duration(session.deadline_at - session.started_at)} to go "
                  f"({mode}), store {steps.redacted(url)}", highlight=False)
    if session.recovered:
        console.print(session.recovered.describe(), highlight=False)
    # SIGTERM (kill, scancel, a job's time limit) stops the run like Ctrl-C: the replicas are
    # stopped and the result is written.
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _supervise_and_finish(req, session, starter, console, system, run_dir, url, count)
    finally:
        # Whatever happened, the caller gets its own handler back.
        signal.signal(signal.SIGTERM, before)


def _nothing_trained(session: steps.Session, result: dict[str, Any]) -> str:
    """Why a run that ended without one completed epoch, its trials having failed before the
    repeated-failure rule could end it (a round limit, the deadline), did not do its job."""
    why = f"no trial completed an epoch: {result['trial_status']['failed']} trial(s) failed"
    try:
        failed = [t for t in session.store.trials(session.run_id) if t.status == TrialStatus.FAILED]
    except StoreError:
        return why
    return why + (f", the last with \"{failed[-1].reason}\"" if failed else "")


def _supervise_and_finish(req: RunRequest, session: steps.Session, starter: Any,
                          console: Console, system: dict[str, Any], run_dir: Path,
                          url: str | None, count: int) -> RunOutcome:
    watch = steps.Watch("interrupted")
    lost = False
    try:
        try:
            if session.deadline_at > session.started_at:
                starter.start()
                if req.launcher == "external":
                    console.print(f"waiting for {count} replica(s): start `automlperf worker "
                                  f"--run-dir {run_dir.resolve()}` once per node with your "
                                  "launcher", highlight=False)
                watch = steps.supervise(session, starter, console)
            else:
                watch = steps.Watch("completed")
        except StoreError:
            lost = True  # finishing would only wait out the store's retries a second time
            raise
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish what was started
            if not lost:
                result = steps.finish(session, starter, console, watch, system)
    except StoreError as exc:
        # The store was reached at the start; losing it now is the run's failure, not the
        # user's input. Replicas are stopped (finish may have failed before it could) and
        # everything written so far stays for --resume.
        starter.stop(session.config.run.stop_grace_s)
        raise Resumable(f"the store failed during the run: {exc}; everything recorded so far "
                         f"is kept in {run_dir}: continue with `automlperf run --resume "
                         f"--run-dir {run_dir}` once it is back") from None
    except OSError as exc:
        if exc.errno not in UNWRITABLE:
            raise
        # The run directory stopped taking writes (its file system filled up or turned
        # read-only): what it holds stays, and the run resumes once it takes them again.
        starter.stop(session.config.run.stop_grace_s)
        fix = "free space there" if exc.errno == errno.ENOSPC else "make it writable"
        raise Resumable(f"cannot write {exc.filename or run_dir}: {exc.strerror}; everything "
                         f"recorded so far is kept in {run_dir}: {fix} and continue with "
                         f"`automlperf run --resume --run-dir {run_dir}`") from None
    joined = starter.joined() if req.launcher == "external" else None
    if joined is not None and joined < count:
        console.print(f"only {joined} of {count} replica(s) joined this session: check "
                      "the site launcher's job and its logs", highlight=False)
    state, reason = watch.state, watch.reason
    if state == "completed" and not result["epochs"] and result["trial_status"].get("failed"):
        state, reason = "failed", _nothing_trained(session, result)
    outcome = RunOutcome(run_dir=run_dir, state=state, reason=reason, result=result,
                         result_path=session.dir.result, replicas=count, joined=joined)
    write_records(outcome, url)
    if session.stopping_since is not None:
        # What stopping and writing the result took: a chain's later jobs are given twice
        # the longest as their signal's lead (joblimits.link_lead).
        record_finish(run_dir, session.segment, time.time() - session.stopping_since, count)
    return outcome


def mlperf_logs(run_dir: Path, url: str | None,
                org: str = "unspecified") -> tuple[dict[str, Path], list[str]]:
    """Write the MLPerf-style logs of a run whose result is written: the files written, and
    what could not be, with the command that redoes it."""
    from automlperf.submission.mlperf import write_mlperf

    written: dict[str, Path] = {}
    problems: list[str] = []
    try:
        for what, where in write_mlperf(run_dir, url, org).items():
            if isinstance(where, Path):
                written[what] = where
            else:
                problems.append(f"{what} not written: {where}")
    except Exception as exc:  # noqa: BLE001 - the result is written; these can be redone
        problems.append(f"MLPerf-style logs not written ({exc}); retry with "
                        f"`automlperf mlperf {run_dir}`")
    return written, problems


def write_records(outcome: RunOutcome, url: str | None) -> None:
    """The MLPerf-style logs and the report of a finished run; what cannot be written is
    noted in ``outcome.problems``."""
    from automlperf.report.html import write_report

    written, problems = mlperf_logs(outcome.run_dir, url)
    outcome.written.update(written)
    outcome.problems += problems
    try:
        outcome.written["report"] = write_report(outcome.run_dir, url)
    except Exception as exc:  # noqa: BLE001 - the result is written; the report can be redone
        outcome.problems.append(f"the report could not be written ({exc}); retry with "
                                f"`automlperf report {outcome.run_dir}`")
