"""SLURM: the batch script that runs a benchmark on a cluster, and the launcher that starts
one replica per node as a job step.

Everything a replica needs to know about itself comes from SLURM's environment: the node
count and node list of the job, its node's name, the GPUs bound to its step.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from automlperf.config import Config
from automlperf.dataset_identity import SHARED_INDEX
from automlperf.errors import UserError
from automlperf.runner.launch import terminate, worker_command
from automlperf.store import connections
from automlperf.store.pgserver import find_binaries
from automlperf.store.rundir import write_atomic
from automlperf.store.urls import redact, split_password


class SlurmError(UserError, RuntimeError):
    """SLURM is missing, refused the job, or a local cluster of it could not start; the
    message says what to do."""


def require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SlurmError(f"{command} not found: run this on a SLURM login node (or load the "
                         "SLURM module), or write the script without --submit")
    return path


def node_names(env: Mapping[str, str] | None = None) -> list[str]:
    """The job's nodes in SLURM's order."""
    nodelist = (os.environ if env is None else env).get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise SlurmError("not inside a SLURM job (SLURM_JOB_NODELIST is not set)")
    done = subprocess.run([require("scontrol"), "show", "hostnames", nodelist],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def cpus_per_node(env: Mapping[str, str] | None = None) -> list[int]:
    """CPUs the job holds on each of its nodes, in node-list order, from
    SLURM_JOB_CPUS_PER_NODE (``72(x2),36``); empty when it is absent or unreadable."""
    text = (os.environ if env is None else env).get("SLURM_JOB_CPUS_PER_NODE", "")
    counts: list[int] = []
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            return []
        counts += [int(found[1])] * int(found[2] or 1)
    return counts


def replica_index(env: Mapping[str, str] | None = None) -> int:
    """This replica's number from SLURM: its task rank when one step runs every replica,
    else its node's position in the job's node list (one step per node)."""
    env = os.environ if env is None else env
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"])
    name = env.get("SLURMD_NODENAME")
    if name is None:
        return int(env.get("SLURM_NODEID", "0"))
    return node_names(env).index(name)


CONTAINER_FILE = "container.json"
RUNTIMES = ("pyxis", "apptainer")


@dataclass
class Container:
    """The image each replica step runs in. The primary and the store stay on the batch
    host, where ``srun`` is; only the steps that train need the accelerator software."""

    runtime: str
    image: str
    mounts: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    python: str = "python3"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise SlurmError(f"container runtime {self.runtime!r} is not one of "
                             f"{', '.join(RUNTIMES)}")

    def binds(self, run_dir: Path) -> list[str]:
        """The run directory at the same path inside (replicas write there), then the
        user's mounts (datasets)."""
        return [f"{run_dir}:{run_dir}", *self.mounts]

    def wrap(self, run_dir: Path, srun_args: list[str], worker: list[str]) -> list[str]:
        """An srun command that runs ``worker`` (whose first word is the host's Python)
        inside the image."""
        inner = [self.python, *worker[1:]]
        if self.runtime == "pyxis":
            return [*srun_args, f"--container-image={self.image}",
                    f"--container-mounts={','.join(self.binds(run_dir))}",
                    "--container-workdir=" + str(run_dir), *self.options, *inner]
        binds = [arg for b in self.binds(run_dir) for arg in ("--bind", b)]
        return [*srun_args, "apptainer", "exec", *self.options, *binds, self.image, *inner]

    def save(self, run_dir: Path) -> None:
        write_atomic(run_dir / CONTAINER_FILE, json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Container | None:
        path = run_dir / CONTAINER_FILE
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise SlurmError(f"{path} is damaged ({exc}): write it again with "
                             "`automlperf slurm --container-image ...`") from None


# Set by sbatch when the job counts memory per CPU or per GPU; srun reads them as options,
# and refuses --mem beside them.
MEMORY_PER_UNIT = ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU")


@dataclass
class SlurmLauncher:
    """One replica per node of the job, each in its own job step, so that a node that dies
    takes down only its replica; in a container when the run directory names one."""

    run_dir: Path
    store_url: str | None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def commands(self, nodes: int, gpus: str | None, cpus: list[int] | None = None,
                 env: Mapping[str, str] | None = None) -> list[list[str]]:
        """The srun command of each node's replica. A step inherits no --cpus-per-task from
        sbatch since Slurm 22.05, and would get one CPU: it asks for the job's own
        --cpus-per-task when the user gave one, else its node's CPUs (``cpus``, per node).
        It asks for all the job's memory there (``--mem=0``) unless the job counts memory
        per CPU or per GPU, which srun refuses beside --mem."""
        env = os.environ if env is None else env
        srun = require("srun")
        logs = self.run_dir / "logs"
        container = Container.load(self.run_dir)
        per_task = env.get("SLURM_CPUS_PER_TASK")
        memory = [] if any(env.get(k) for k in MEMORY_PER_UNIT) else ["--mem=0"]
        out = []
        for i in range(nodes):
            cmd = [srun, "--nodes=1", "--ntasks=1", f"--relative={i}", "--kill-on-bad-exit=0",
                   f"--job-name=automlperf-replica-{i}", f"--output={logs}/replica-{i}.log",
                   *memory]
            if per_task:
                cmd.append(f"--cpus-per-task={per_task}")
            elif cpus and i < len(cpus):
                cmd.append(f"--cpus-per-task={cpus[i]}")
            if gpus:
                cmd.append(f"--gpus-per-node={gpus}")
            # The index on the command line: a site whose srun defaults to PMIx would
            # otherwise give every one-task step PMIX_RANK=0.
            worker = worker_command(self.run_dir, i, None, None,
                                    require_accelerators=bool(gpus and gpus != "0"))
            out.append(container.wrap(self.run_dir, cmd, worker) if container else cmd + worker)
        return out

    def start(self) -> None:
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "0"))
        if nodes < 1:
            raise SlurmError("not inside a SLURM job (SLURM_JOB_NUM_NODES is not set)")
        (self.run_dir / "logs").mkdir(exist_ok=True)
        env = dict(os.environ)
        if self.store_url:
            env["AUTOMLPERF_STORE_URL"] = self.store_url
        for cmd in self.commands(nodes, os.environ.get("SLURM_GPUS_PER_NODE"), cpus_per_node()):
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def stop(self, grace_s: float) -> None:
        # srun answers SIGTERM by cancelling its step, which ends the replica there.
        terminate(self.procs, grace_s, lambda p: p.kill())


def format_time(seconds: float) -> str:
    seconds = int(seconds + 59) // 60 * 60  # whole minutes, rounded up
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}-{hours:02d}:{rest // 60:02d}:00" if days else f"{hours}:{rest // 60:02d}:00"


# Time the job gives the start-up before the run's clock: the private PostgreSQL server,
# the primary's imports and system description, and loading the dataset index that
# `automlperf slurm` saved at submission. Measured here at under half a minute in all
# (bench/RESULTS.md, "A cluster job's start-up"); the rest is room for a busy shared file
# system. A start-up that takes longer starts no clock (JobLimit).
STARTUP_S = 300.0


def margins(duration_s: float, startup_s: float = STARTUP_S) -> tuple[float, int]:
    """(time limit, signal lead) in seconds. The job holds the start-up, the run, and the
    lead: the primary's time to stop the replicas and write the result once signalled,
    which SLURM may send up to a minute early, so the signal still lands after the run's
    own deadline however long the start-up took within ``startup_s``."""
    lead = int(max(120.0, 0.03 * duration_s))
    return startup_s + duration_s + lead + 60, lead


# The script exports what the primary must leave free at the job's end: the lead and the
# minute SLURM may signal early (margins()).
MARGIN_ENV = "AUTOMLPERF_JOB_MARGIN_S"


@dataclass
class JobLimit:
    """The batch job's own time: when it started and when SLURM ends it; a session must be
    over ``margin_s`` before the end."""

    started_at: float
    ends_at: float
    margin_s: float

    @property
    def must_end_by(self) -> float:
        return self.ends_at - self.margin_s

    def advice(self, remaining: float, now: float) -> str:
        needed = (now - self.started_at) + remaining + self.margin_s
        return (f"submit it again with a time limit of at least {format_time(needed)} "
                f"(sbatch --time={format_time(needed)} RUN_DIR/automlperf.sbatch), or let "
                "`automlperf slurm --resume --run-dir RUN_DIR --submit` size it")


def _slurm_time(text: str) -> float | None:
    """A time squeue prints (``2026-01-01T12:00:00``, local time); None for N/A, Unknown."""
    try:
        return datetime.datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def job_limit(env: Mapping[str, str] | None = None) -> JobLimit | None:
    """This batch job's start and end (SLURM_JOB_START_TIME/END_TIME where SLURM sets
    them, else squeue's), or None outside a job or for one without a time limit."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    start, end = env.get("SLURM_JOB_START_TIME"), env.get("SLURM_JOB_END_TIME")
    if start and end and start.isdigit() and end.isdigit():
        started, ends = float(start), float(end)
    else:
        done = subprocess.run([require("squeue"), "-h", "-j", job, "-o", "%S %e"],
                              capture_output=True, text=True)
        fields = done.stdout.split()
        if done.returncode != 0 or len(fields) != 2:
            return None
        started_at, ends_at = _slurm_time(fields[0]), _slurm_time(fields[1])
        if started_at is None or ends_at is None:
            return None
        started, ends = started_at, ends_at
    return JobLimit(started, ends, float(env.get(MARGIN_ENV, "180")))


@dataclass
class ScriptOptions:
    run_dir: Path
    nodes: int
    duration_s: float
    # The deadline's grace for epochs in flight (config run.deadline_grace_s); None: its
    # default, a quarter of the duration.
    grace_s: float | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    store_url: str | None = None
    partition: str | None = None
    account: str | None = None
    time_limit_s: float | None = None
    settings: Config | None = None  # the run's configuration, resolved; None: the default
    job_name: str = "automlperf"
    sbatch_extra: list[str] = field(default_factory=list)
    container: Container | None = None
    # The whole node for each replica (a benchmark shares no node's CPUs, memory or GPUs);
    # False leaves the node's sharing to the site and to --cpus-per-task and --sbatch.
    exclusive: bool = True
    small_task: bool = False  # the built-in or digits task on several nodes, asked for

    def all_memory(self) -> bool:
        """Ask for all of each node's memory (``--mem=0``): on whole nodes, unless the user
        sets the job's memory (sbatch refuses --mem beside --mem-per-cpu/--mem-per-gpu)."""
        return self.exclusive and not any(re.match(r"--mem(-per-(cpu|gpu))?(=|\s|$)", extra.strip())
                                          for extra in self.sbatch_extra)


@dataclass
class Written:
    """A batch script written, and what sized its time limit."""

    script: Path
    time_limit_s: float
    signal_lead_s: int
    startup_s: float
    dataset: dict[str, Any] | None = None  # the dataset index saved at submission


def write_script(opts: ScriptOptions) -> Path:
    """Write RUN_DIR/automlperf.sbatch (and the files it needs); return its path."""
    return write_job(opts).script


def write_job(opts: ScriptOptions) -> Written:
    """Write RUN_DIR/automlperf.sbatch and the files it needs. An image-folder dataset is
    scanned here, once, before the job: its identity is checked (an official run on other
    data is refused now, not in the queue) and its file index saved in the run directory,
    where the job's primary and replicas load it instead of walking the folder again."""
    run_dir = opts.run_dir.resolve()
    if (run_dir / "run.json").exists():
        raise SlurmError(f"{run_dir} already holds a run; choose a new --run-dir, or resubmit "
                         f"it with `automlperf slurm --resume --run-dir {run_dir}`")
    # Fail here, on the login node, rather than in the queue.
    if opts.store_url is None:
        find_binaries()
    else:
        connections.check_room(opts.store_url, opts.nodes)  # one replica per node
    settings = opts.settings
    if settings is not None:
        from automlperf.runner.primary import check_cluster_task

        settings.check_official()
        check_cluster_task(settings, opts.nodes, opts.small_task)
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = _scan_dataset(settings, run_dir) if settings is not None else None
    (run_dir / "logs").mkdir(exist_ok=True)
    if opts.store_url is None:
        (run_dir / "postgres").mkdir(exist_ok=True)
    password_file = None
    store_url = None
    if opts.store_url:
        store_url, password = split_password(opts.store_url)
        if password is not None:
            # Kept out of the script and the logs, in a file only its owner can read.
            password_file = run_dir / ".store-password"
            old = os.umask(0o077)
            try:
                password_file.write_text(password + "\n")
            finally:
                os.umask(old)
    # The job outlives the deadline by the grace the epochs in flight have to finish.
    grace = opts.duration_s / 4 if opts.grace_s is None else opts.grace_s
    limit, lead = margins(opts.duration_s + grace)
    if opts.time_limit_s is not None:
        if opts.time_limit_s < opts.duration_s + grace + 120:
            raise SlurmError(f"--time-limit {format_time(opts.time_limit_s)} leaves no room to "
                             f"finish the epochs in flight ({grace:.0f} s of grace), stop and "
                             f"write the result after a {opts.duration_s:.0f} s run: give at "
                             "least the grace and 2 minutes more than --duration (or lower "
                             "[run] deadline_grace_s)")
        limit = opts.time_limit_s
        lead = int(max(30, min(lead, limit - opts.duration_s - grace - 60)))
    if opts.container is not None:
        opts.container.save(run_dir)
    run_args = [f"--duration {int(opts.duration_s)}s"]
    if settings is not None:
        config_copy = run_dir / "submitted-config.toml"
        write_atomic(config_copy, settings.to_toml())
        run_args.insert(0, f"--config {shlex.quote(str(config_copy))}")
    if opts.small_task:
        run_args.append("--small-task")
    env = jinja2.Environment(loader=jinja2.PackageLoader("automlperf.runner", "."),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    script = run_dir / "automlperf.sbatch"
    text = env.get_template("slurm.sh.j2").render(
        written=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), script=script,
        run_dir=run_dir, nodes=opts.nodes, gpus_per_node=opts.gpus_per_node,
        cpus_per_task=opts.cpus_per_task, time_limit=format_time(limit), signal_s=lead,
        margin_s=lead + 60, margin_env=MARGIN_ENV,
        partition=opts.partition, account=opts.account, job_name=opts.job_name,
        sbatch_extra=opts.sbatch_extra, python=sys.executable, store_url=store_url,
        store_shown=redact(store_url) if store_url else None, password_file=password_file,
        run_args=" ".join(run_args), container=opts.container, exclusive=opts.exclusive,
        all_memory=opts.all_memory(), dataset=dataset)
    write_atomic(script, text)
    script.chmod(0o750)
    return Written(script, limit, lead, STARTUP_S, dataset)


def _scan_dataset(settings: Config, run_dir: Path) -> dict[str, Any] | None:
    """Scan the run's image folder now and save its index in the run directory (see
    write_job); what was found, for the script's header and the command's output."""
    from automlperf.runner.session import record_origin

    data_dir = settings.data.data_dir
    if settings.data.dataset != "imagenet" or data_dir is None:
        return None
    if not Path(data_dir).is_dir():
        raise SlurmError(f"{data_dir} is not readable here: `automlperf slurm` scans the dataset "
                         "once, before the job, so that the job's clock and time limit do not "
                         "pay for a million file look-ups; run it on a node that sees the data "
                         "at the path the compute nodes use (srun -N1 --pty automlperf slurm ...)")
    origin = record_origin(settings, run_dir=run_dir)
    identity = origin["dataset_identity"] or {}
    startup = origin.get("startup", {})
    return {"files": identity.get("files"), "classes": identity.get("classes"),
            "fingerprint": identity.get("fingerprint"), "problems": identity.get("problems", []),
            "scan_s": startup.get("dataset_scan_s"), "index": str(run_dir / SHARED_INDEX)}


def resubmission(run_dir: Path) -> tuple[float, float]:
    """(time limit, seconds of the run left) for submitting a run's script again: the time
    the run still needs, its start-up and the margin to write the result."""
    from automlperf.store.rundir import run_store

    run_dir = run_dir.resolve()
    if not (run_dir / "automlperf.sbatch").exists():
        raise SlurmError(f"{run_dir} has no automlperf.sbatch: write one with `automlperf slurm`")
    text = (run_dir / "automlperf.sbatch").read_text()
    # The script's signal lead stays (its #SBATCH line, and what it tells the primary).
    signal = re.search(r"#SBATCH --signal=B:TERM@(\d+)", text)
    lead = float(signal.group(1)) if signal else float(margins(0)[1])
    if not (run_dir / "run.json").exists():
        # The job never started the run's clock: it needs the whole duration.
        found = re.search(r"--duration (\d+)s", text)
        if found is None:
            raise SlurmError(f"{run_dir}/automlperf.sbatch names no --duration")
        left = float(found.group(1))
    else:
        from automlperf.store.rundir import RunDir

        rd = RunDir(run_dir)
        run_id = int(rd.meta()["run_id"])
        with run_store(run_dir) as store:
            duration = float(store.run(run_id)["duration_s"])
            done = sum(min(s.end, s.deadline_at) - s.started_at for s in store.segments(run_id))
        left = max(0.0, duration - done)
    return STARTUP_S + left + _grace(run_dir) + lead + 60, left


def _grace(run_dir: Path) -> float:
    """The grace the submitted run gives epochs in flight at its deadline."""
    from automlperf.config import Config

    submitted = run_dir / "submitted-config.toml"
    return Config.load(submitted).deadline_grace() if submitted.exists() else 0.0


def submit(script: Path, test_only: bool = False, options: list[str] | None = None) -> str:
    """sbatch the script (``options`` before it override its #SBATCH lines); the job id (or
    sbatch's verdict with ``test_only``)."""
    cmd = [require("sbatch")] + (["--test-only"] if test_only else ["--parsable"]) + \
        (options or []) + [str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused {script}: {done.stderr.strip()}")
    if test_only:
        return done.stderr.strip() or done.stdout.strip()
    return done.stdout.strip().split(";")[0]
