"""The batch job's time, whatever the scheduler: the time limit a job needs for a run of some
duration (``automlperf job-time``, for a script's walltime line), and the limit of the job a
primary runs in, so that a clock the job could not hold is never started (session.py).

SLURM's own limit is read by runner/slurm.py. PBS, LSF and Flux are asked with their own
commands (``qstat -f``, ``bjobs -o``, ``flux job timeleft``); any other scheduler (or a
Kubernetes Job's deadline) can state the job's end in ``AUTOMLPERF_JOB_END`` (Unix time).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from automlperf.config import Config
from automlperf.errors import UserError
from automlperf.runner.slurm import MARGIN_ENV, JobLimit, format_time, job_limit

# Time the job gives the start-up before the run's clock: the private PostgreSQL server,
# the primary's imports and system description, and loading the dataset index that
# `automlperf slurm` saved at submission. Measured here at under half a minute in all
# (bench/RESULTS.md, "A cluster job's start-up"); the rest is room for a busy shared file
# system. A start-up that takes longer starts no clock (JobLimit).
STARTUP_S = 300.0
# The job's end, for a scheduler automlperf does not ask (Unix time).
JOB_END_ENV = "AUTOMLPERF_JOB_END"
SCHEDULERS = ("slurm", "pbs", "lsf", "flux")
# Set in the environment of a job of a chain (runner/chain.py): its primary may start a clock
# the job cannot hold to the run's end; the job's signal stops it and the next job goes on.
CHAIN_ENV = "AUTOMLPERF_CHAIN_LINK"
# The chain's job ids, one a line, in the run directory: the job that ends the run cancels
# those after its own.
CHAIN_FILE = "chain.jobs"
# Written by the job that ends the run (or cannot go on): a later job that starts all the
# same finds it and does nothing.
OVER_FILE = "chain.over"
# The least run a job of a chain must hold to start its clock, and that a chain's jobs are
# planned to hold, or the chain would spend its jobs starting up.
MIN_LINK_RUN_S = 60.0
# A resubmission that extends the run (`automlperf slurm --resume --duration`) passes the new
# duration (seconds) to its job in this variable: the job's primary makes the extension when
# its clock starts; the login node writes nothing of it.
EXTEND_ENV = "AUTOMLPERF_EXTEND_TO"
# The staging allowance (seconds) of a resubmission given `--stage-time`: each node's copy is
# cut off after it (the script's own allowance otherwise).
STAGE_ENV = "AUTOMLPERF_STAGE_S"
# The least lead a job of a chain gives the primary to stop the replicas and write the
# result after its time limit's signal: what writing it measured takes (twice that, see
# link_lead) never less. Writing the result took 100 s at 512 simulated nodes
# (bench/RESULTS.md); a new chain, measured nothing yet, is given this.
LEAD_FLOOR_S = 120
# Each session's stop, as the primary measured it (finish.jsonl in the run's logs).
FINISH_LOG = "finish.jsonl"
# A job of a chain is submitted with its own lead (chain.py): the margin its primary leaves
# at the job's end, which replaces the script's own.
LINK_MARGIN_ENV = "AUTOMLPERF_LINK_MARGIN_S"
log = logging.getLogger("automlperf")


def margins(duration_s: float, startup_s: float = STARTUP_S) -> tuple[float, int]:
    """(time limit, signal lead) in seconds. The job holds the start-up, the run, and the
    lead: the primary's time to stop the replicas and write the result once signalled,
    which the scheduler may send early (SLURM: up to a minute), so the signal still lands
    after the run's own deadline however long the start-up took within ``startup_s``."""
    lead = int(max(120.0, 0.03 * duration_s))
    return startup_s + duration_s + lead + 60, lead


def link_lead(measured_s: float | None) -> int:
    """The signal's lead of a job of a chain: twice the longest stop the run measured (its
    replicas stopped, its result and report written), at least LEAD_FLOOR_S. It does not
    grow with the run: each job writes the result of the time run so far, whatever its
    length (a fixed share of the whole run was 55 minutes in each 8-hour job of a 24-hour
    run)."""
    if measured_s is None or not math.isfinite(measured_s) or measured_s <= 0:
        return LEAD_FLOOR_S
    return int(max(LEAD_FLOOR_S, math.ceil(2 * measured_s)))


def measured_finish(run_dir: Path) -> float | None:
    """The longest stop of the run's sessions so far (seconds from the stop's start to its
    result and report written), as each primary recorded it; None before any."""
    path = Path(run_dir) / "logs" / FINISH_LOG
    longest = None
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            seconds = float(json.loads(line)["finish_s"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
        longest = seconds if longest is None else max(longest, seconds)
    return longest


def record_finish(run_dir: Path, segment: int, finish_s: float, replicas: int) -> None:
    """Append one session's stop to the run's FINISH_LOG (what later jobs of a chain size
    their lead from)."""
    path = Path(run_dir) / "logs" / FINISH_LOG
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"segment": segment, "finish_s": round(finish_s, 3),
                            "replicas": replicas, "at": round(time.time(), 3)}) + "\n")


@dataclass(frozen=True)
class JobTime:
    """What a job holds besides its run: the start-up before the clock, the grace for the
    epochs in flight, and the result."""

    limit_s: float
    startup_s: float
    duration_s: float
    grace_s: float

    @property
    def result_s(self) -> float:
        return self.limit_s - self.startup_s - self.duration_s - self.grace_s


def job_time(settings: Config, stage_s: float = 0.0, scan_s: float = 0.0) -> JobTime:
    """The time limit of a job that runs ``settings`` (its duration and grace), with the
    start-up allowance of ``automlperf slurm``'s jobs (whose data was scanned at
    submission), ``stage_s`` for copying the data and ``scan_s`` for scanning it in the job."""
    grace = settings.deadline_grace()
    startup = STARTUP_S + stage_s + scan_s
    limit, _ = margins(settings.run.duration_s + grace, startup)
    return JobTime(limit, startup, settings.run.duration_s, grace)


def scheduler_time(seconds: float, scheduler: str) -> str:
    """``seconds`` (rounded up to whole minutes) as the scheduler's walltime option takes it:
    SLURM's ``H:MM:SS``, PBS's ``HH:MM:SS``, LSF's ``H:MM`` (``bsub -W``), Flux's ``Nm``."""
    minutes = math.ceil(seconds / 60)
    if scheduler == "slurm":
        return format_time(minutes * 60)
    if scheduler == "pbs":
        return f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    if scheduler == "lsf":
        return f"{minutes // 60}:{minutes % 60:02d}"
    if scheduler == "flux":
        return f"{minutes}m"
    raise ValueError(f"unknown scheduler {scheduler!r}: one of {', '.join(SCHEDULERS)}")


RESUBMIT = {"pbs": "`qsub -l walltime={t}`", "lsf": "`bsub -W {t}`", "flux": "`flux batch -t {t}`"}


@dataclass
class SchedulerLimit(JobLimit):
    """The limit of a PBS, LSF or Flux job, or one stated in AUTOMLPERF_JOB_END
    (``scheduler`` "stated"): its advice names that scheduler's option."""

    def advice(self, remaining: float, now: float) -> str:
        needed = (now - self.started_at) + remaining + self.margin_s
        if self.scheduler in RESUBMIT:
            how = RESUBMIT[self.scheduler].format(t=scheduler_time(needed, self.scheduler))
            return f"submit it again with {how} or more"
        return (f"give the job at least {format_time(needed)} (its end, {JOB_END_ENV}, "
                f"is {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.ends_at))})")


def _hms(text: str) -> float | None:
    """``[[H:]M:]S`` as seconds; None for anything else (``-``, ``UNLIMITED``)."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+(\.\d+)?", p) for p in parts):
        return None
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + float(part)
    return seconds


# What `flux job timeleft` prints for a job without a time limit (UINT_MAX seconds).
FLUX_NO_LIMIT = 4294967295.0


def _seconds(env: Mapping[str, str], name: str, default: str, low: float, high: float,
             what: str) -> float:
    text = env.get(name, default).strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN and infinities included
        raise UserError(f"{name}={text!r} is not {what}: set it so, or unset it")
    return value


def _ask(command: list[str], env: Mapping[str, str]) -> str | None:
    if shutil.which(command[0], path=env.get("PATH")) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s did not answer (%s): the job's time limit is not checked", command[0], exc)
        return None
    if done.returncode != 0:
        log.warning("%s failed (%s): the job's time limit is not checked", " ".join(command),
                    (done.stderr.strip().splitlines() or ["no message"])[-1])
        return None
    return done.stdout


def pbs_times(qstat_f: str) -> tuple[float, float] | None:
    """(walltime, walltime used) from ``qstat -f``'s ``Resource_List.walltime`` and
    ``resources_used.walltime`` (PBS Pro, OpenPBS, Torque); None without a walltime."""
    found = dict(re.findall(r"^\s*(Resource_List\.walltime|resources_used\.walltime)\s*=\s*(\S+)",
                            qstat_f, re.MULTILINE))
    limit = _hms(found.get("Resource_List.walltime", ""))
    if limit is None:
        return None
    return limit, _hms(found.get("resources_used.walltime", "")) or 0.0


def lsf_times(bjobs_o: str) -> tuple[float, float] | None:
    """(run limit, run time) from ``bjobs -noheader -hms -o "runtimelimit run_time"``;
    None without a limit (``-``)."""
    fields = bjobs_o.split()
    if len(fields) < 2:
        return None
    limit = _hms(fields[0].split("/")[0])  # ABS_RUNLIMIT may add /host without -hms
    if limit is None:
        return None
    return limit, _hms(fields[1]) or 0.0


def batch_job_limit(env: Mapping[str, str] | None = None,
                    process_start: float | None = None) -> JobLimit | None:
    """:func:`job_limit_of`, marked as a chain's job where CHAIN_ENV is set."""
    env = os.environ if env is None else env
    limit = job_limit_of(env, process_start)
    if limit is not None and env.get(CHAIN_ENV, "").strip():
        limit = dataclasses.replace(limit, chain_link=True)
    return limit


def job_limit_of(env: Mapping[str, str], process_start: float | None = None) -> JobLimit | None:
    """The limit of the batch job this process runs in: AUTOMLPERF_JOB_END where set, else
    that of SLURM, Flux, PBS or LSF, asked of the scheduler; None outside a job, for a job
    without a limit, or where the scheduler does not answer. ``process_start`` stands for the
    job's start where the scheduler tells only the time left (Flux)."""
    margin = _seconds(env, MARGIN_ENV, "180", 0.0, 86400.0, "a number of seconds")
    now = time.time()
    started = process_start if process_start is not None else now
    if env.get(JOB_END_ENV, "").strip():
        # Seconds since 1970, between 2001 and 5138: not milliseconds, not a duration.
        end = _seconds(env, JOB_END_ENV, "", 1e9, 1e11, "the job's end in seconds since "
                       "1970 (e.g. $(( $(date +%s) + 3600 )))")
        return SchedulerLimit(started, end, margin, scheduler="stated")
    if env.get("SLURM_JOB_ID"):
        return job_limit(env)
    # A `flux batch` script runs in an instance of its own (FLUX_URI), where the broker has
    # unset FLUX_JOB_ID; `flux job timeleft` then answers for that instance.
    if env.get("FLUX_JOB_ID") or env.get("FLUX_URI"):
        said = _ask(["flux", "job", "timeleft"], env)
        try:
            left = float(said.strip()) if said else math.inf
        except ValueError:
            return None
        if not math.isfinite(left) or left >= FLUX_NO_LIMIT:
            return None
        return SchedulerLimit(started, now + left, margin, scheduler="flux")
    if env.get("PBS_JOBID"):
        said = _ask(["qstat", "-f", env["PBS_JOBID"]], env)
        times = pbs_times(said) if said else None
        scheduler = "pbs"
    elif env.get("LSB_JOBID"):
        said = _ask(["bjobs", "-noheader", "-hms", "-o", "runtimelimit run_time",
                     env["LSB_JOBID"]], env)
        times = lsf_times(said) if said else None
        scheduler = "lsf"
    else:
        return None
    if times is None:
        return None
    limit, used = times
    return SchedulerLimit(now - used, now - used + limit, margin, scheduler=scheduler)
