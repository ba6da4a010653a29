"""SLURM inside the job: the job's environment (its nodes, this replica's index, the job's
time limit) and the launcher that starts one replica per node as a job step. The batch script
that submits the job is written by runner/sbatch.py, on the login node.

Everything a replica needs to know about itself comes from SLURM's environment: the node
count and node list of the job, its node's name, the GPUs bound to its step.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from automlperf.errors import UserError
from automlperf.runner.launch import LAUNCHED_ENV, terminate, worker_command
from automlperf.store.rundir import write_atomic
from automlperf.store.urls import replica_env


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
# The name of the job's pyxis container on each node: pyxis keeps a named container for the
# rest of the job and skips the import for a later step that names it; where it keeps them
# across jobs (container_scope=global), a fixed name would find an earlier run's container
# and never import this run's image. So the name is the job's own.
PYXIS_PREFIX = "automlperf-"
PYXIS_NAME = PYXIS_PREFIX + "$SLURM_JOB_ID"  # as the batch script writes it


def pyxis_name(env: Mapping[str, str] | None = None) -> str:
    """The job's pyxis container name (PYXIS_NAME), for this job."""
    return PYXIS_PREFIX + (os.environ if env is None else env).get("SLURM_JOB_ID", "job")


@dataclass
class Container:
    """The image each replica step runs in. The primary and the store stay on the batch
    host, where ``srun`` is; only the steps that train need the accelerator software."""

    runtime: str
    image: str
    mounts: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    python: str = "python3"
    # Where the replicas see the run's dataset inside the image (a mount's destination).
    data_root: str | None = None
    # The image's own digest: a local file's SHA-256, or the one a reference pins
    # (``name@sha256:...``); None for a reference by tag alone.
    digest: str | None = None

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise SlurmError(f"container runtime {self.runtime!r} is not one of "
                             f"{', '.join(RUNTIMES)}")

    def binds(self, run_dir: Path) -> list[str]:
        """The run directory at the same path inside (replicas write there), then the
        user's mounts (datasets)."""
        return [f"{run_dir}:{run_dir}", *self.mounts]

    def pin(self) -> str | None:
        """Find the image's digest (see ``digest``): a local image file is read once."""
        if "@sha256:" in self.image:
            self.digest = "sha256:" + self.image.rsplit("@sha256:", 1)[1]
        elif os.path.isfile(self.image):
            with open(self.image, "rb") as f:
                self.digest = "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
        return self.digest

    def record(self) -> dict[str, str | None]:
        """What system.json records of the image the replicas trained in."""
        return {"runtime": self.runtime, "image": self.image, "digest": self.digest}

    def inside(self, run_dir: Path, host: Path) -> Path | None:
        """Where the host's path ``host`` is inside the image: under the destination of the
        deepest mount (the run directory's, or one of the user's) whose source holds it, as
        typed or through its symbolic links; None where no mount holds it."""
        found: tuple[int, Path] | None = None
        real = Path(os.path.realpath(host))
        for bind in self.binds(run_dir):
            parts = bind.split(":")
            source, target = Path(parts[0]), Path(parts[1] if len(parts) > 1 else parts[0])
            for root in {source, Path(os.path.realpath(source))}:
                for path in (host, real):
                    if path == root or root in path.parents:
                        depth = len(root.parts)
                        if found is None or depth > found[0]:
                            found = (depth, target / path.relative_to(root))
        return None if found is None else found[1]

    def wrap(self, run_dir: Path, srun_args: list[str], worker: list[str],
             around: Sequence[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
        """An srun command that runs ``worker`` (whose first word is the host's Python)
        inside the image, reading the dataset where the image sees it; ``around``, a command
        that runs the worker (the task's shell), runs where srun starts the task: in the
        image with pyxis, on the host around ``apptainer exec``."""
        inner = [self.python, *worker[1:]]
        if self.data_root is not None:
            inner += ["--data-root", self.data_root]
        if self.runtime == "pyxis":
            # The image unpacked once per node and job, before the clock (the batch
            # script's first step, under this name); the step finds it there.
            return [*srun_args, f"--container-image={self.image}",
                    f"--container-name={pyxis_name(env)}",
                    f"--container-mounts={','.join(self.binds(run_dir))}",
                    "--container-workdir=" + str(run_dir), *self.options, *around, *inner]
        binds = [arg for b in self.binds(run_dir) for arg in ("--bind", b)]
        return [*srun_args, *around, "apptainer", "exec", *self.options, *binds, self.image,
                *inner]

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
# What srun writes when the controller declares a node of the step down.
NODE_FAILURE = re.compile(r"Node failure on (\S+)")
# What srun writes of a task that ended badly: its exit status, or the signal that killed
# it. A task killed outright with its shell (its node's OOM killer, its process group
# SIGKILLed) leaves no exit status file: srun's word is then the first.
TASK_ENDED = re.compile(r"task (\d+): (?:Exited with exit code (\d+)|(Killed|Terminated|.*?))\s*$",
                        re.M)
SIGNALLED = {"Killed": -9, "Terminated": -15, "Segmentation fault": -11, "Aborted": -6,
             "Bus error": -7}
UNKNOWN_END = -256  # a task srun says ended badly, in words of its own
# The exit status reported for a replica whose node was lost: it was killed with its node.
NODE_LOST = -9
EXIT_FILE = re.compile(r"replica-(\d+)\.exit")
# How often supervision looks at the replicas' exit statuses and srun's log.
REFRESH_S = 0.5


def task_script(logs: Path) -> str:
    """The shell around each task's replica: the replica's index is the task's rank, and
    its exit status is left in ``logs`` (srun reports only the first failures and the
    worst), so that the primary knows which replicas ended and how while the step goes on."""
    exit_file = shlex.quote(str(logs)) + '/replica-"$SLURM_PROCID".exit'
    return (f'"$@" --replica-index "$SLURM_PROCID"; status=$?; echo "$status" > {exit_file}; '
            'exit "$status"')


@dataclass
class StepTask:
    """One replica of the step, as supervision sees a process: ended once its exit status
    is in the logs, its node is lost, or the step is over."""

    launcher: SlurmLauncher
    index: int

    def poll(self) -> int | None:
        return self.launcher.exit_code(self.index)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("replica", timeout or 0.0)
            time.sleep(0.2)
        return code


@dataclass
class SlurmLauncher:
    """Every node's replica started by one job step: one srun on the batch host whose tasks,
    one per node, slurmstepd fans out in a tree (a job of 512 nodes makes one step, not 512);
    in a container when the run directory names one. A replica that exits, or a node that
    dies, costs that replica only: the step goes on with the others (--no-kill,
    --kill-on-bad-exit=0, --wait=0)."""

    run_dir: Path
    store_url: str | None
    # What each task runs, its replica index appended (default: `automlperf worker`).
    worker: list[str] | None = None
    procs: list[StepTask] = field(default_factory=list)
    srun: subprocess.Popen[bytes] | None = None
    nodes: list[str] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    codes: dict[int, int] = field(default_factory=dict)
    # Nodes of the job left out of the run (the health sweep found them unable to train).
    excluded: list[str] = field(default_factory=list)
    _looked: float = -math.inf
    _step: int | None = None
    _srun_log_size: int = -1
    # Where this step's part of srun's log begins: it is appended to by every job of the run,
    # and an earlier step's words (its tasks ended at its stop, a node it lost) are not this
    # one's.
    _srun_log_from: int = 0

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    def command(self, nodes: int, gpus: str | None, cpus: list[int] | None = None,
                env: Mapping[str, str] | None = None) -> list[str]:
        """The srun command of the replicas' step. A step inherits no --cpus-per-task from
        sbatch since Slurm 22.05, and would get one CPU: it asks for the job's own
        --cpus-per-task when the user gave one, else its nodes' CPUs (``cpus``, per node;
        --whole where they differ, one count being the step's for every task). It asks for
        all the job's memory there (``--mem=0``) unless the job counts memory per CPU or per
        GPU, which srun refuses beside --mem."""
        env = os.environ if env is None else env
        container = Container.load(self.run_dir)
        per_task = env.get("SLURM_CPUS_PER_TASK")
        memory = [] if any(env.get(k) for k in MEMORY_PER_UNIT) else ["--mem=0"]
        cmd = [require("srun"), f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
               # A node lost, or a replica ended, ends neither the step nor the others.
               "--no-kill", "--kill-on-bad-exit=0", "--wait=0",
               "--job-name=automlperf-replicas", f"--output={self.logs}/replica-%t.log",
               # A resumed or requeued run adds to its replicas' logs.
               "--open-mode=append", *memory]
        if self.excluded:
            cmd.append(f"--exclude={','.join(self.excluded)}")
        counts = set((cpus or [])[:nodes])
        if per_task:
            cmd.append(f"--cpus-per-task={per_task}")
        elif len(counts) == 1:
            cmd.append(f"--cpus-per-task={counts.pop()}")
        elif counts:
            cmd.append("--whole")
        if gpus:
            cmd.append(f"--gpus-per-node={gpus}")
        worker = self.worker or worker_command(self.run_dir, None, None, None,
                                               require_accelerators=bool(gpus and gpus != "0"),
                                               retired_status=0)
        around = ["sh", "-c", task_script(self.logs), "automlperf-replica"]
        return (container.wrap(self.run_dir, cmd, worker, around, env) if container
                else cmd + around + worker)

    def start(self) -> None:
        count = int(os.environ.get("SLURM_JOB_NUM_NODES", "0"))
        if count < 1:
            raise SlurmError("not inside a SLURM job (SLURM_JOB_NUM_NODES is not set)")
        self.logs.mkdir(exist_ok=True)
        # A replica's exit status from an earlier session of the run is not this one's.
        for old in self.logs.glob("replica-*.exit"):
            old.unlink()
        self.codes.clear()
        self.lost.clear()
        self._looked = -math.inf
        try:
            self._srun_log_from = (self.logs / "srun.log").stat().st_size
        except OSError:
            self._srun_log_from = 0
        names = node_names()[:count]
        cpus = cpus_per_node()
        if self.excluded:
            # The step's tasks go to the job's other nodes, in the job's order.
            kept = [i for i, name in enumerate(names) if name not in self.excluded]
            names, cpus = [names[i] for i in kept], [cpus[i] for i in kept if i < len(cpus)]
        count = len(names)
        self.nodes = names
        env = replica_env(dict(os.environ, **{LAUNCHED_ENV: f"{time.time():.3f}"}),
                          self.store_url)
        cmd = self.command(count, os.environ.get("SLURM_GPUS_PER_NODE"), cpus, env)
        with open(self.logs / "srun.log", "ab") as err:
            self.srun = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.procs = [StepTask(self, i) for i in range(count)]

    def _refresh(self) -> None:
        """Read what changed since the last look, at most every REFRESH_S: the exit statuses
        written (one listing of the logs folder, which may sit on a shared file system, not a
        file per replica per look) and srun's log where it grew."""
        now = time.monotonic()
        if now - self._looked < REFRESH_S:
            return
        self._looked = now
        self._step = None if self.srun is None else self.srun.poll()
        for name in os.listdir(self.logs):
            found = EXIT_FILE.fullmatch(name)
            if found and int(found[1]) not in self.codes:
                try:
                    self.codes[int(found[1])] = int((self.logs / name).read_text())
                except (OSError, ValueError):
                    pass  # being written: the next look reads it
        try:
            log = self.logs / "srun.log"
            if log.stat().st_size != self._srun_log_size:
                with open(log, "rb") as f:
                    f.seek(self._srun_log_from)
                    data = f.read()
                self._srun_log_size = self._srun_log_from + len(data)
                text = data.decode(errors="replace")
                self.lost.update(NODE_FAILURE.findall(text))
                for task, code, signal in TASK_ENDED.findall(text):
                    if int(task) not in self.codes:
                        self.codes[int(task)] = int(code) if code else next(
                            (v for k, v in SIGNALLED.items() if signal.startswith(k)),
                            UNKNOWN_END)
        except OSError:
            pass

    def exit_code(self, index: int) -> int | None:
        """The replica's exit status; None while it runs."""
        self._refresh()
        if index in self.codes:
            return self.codes[index]
        if self.node_lost(index):
            return NODE_LOST
        if self.srun is None:
            return NODE_LOST  # never started
        # The step over, no status seen: srun's own, the worst of its tasks (0: every task
        # exited 0, its file not yet seen through a shared file system's caches).
        return self._step

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def states(self) -> list[str]:
        """``up``, ``exited``, or ``node lost`` (srun's word that the controller declared
        the replica's node down), per replica."""
        codes = [p.poll() for p in self.procs]
        return ["up" if code is None else "node lost" if self.node_lost(i) else "exited"
                for i, code in enumerate(codes)]

    def node_lost(self, index: int) -> bool:
        """Whether srun said the replica's node failed (as of the last look)."""
        return index < len(self.nodes) and self.nodes[index] in self.lost

    def stop(self, grace_s: float) -> None:
        # srun answers SIGTERM by cancelling its step, which ends every replica.
        if self.srun is not None:
            terminate([self.srun], grace_s, lambda p: p.kill())


def format_time(seconds: float) -> str:
    seconds = int(seconds + 59) // 60 * 60  # whole minutes, rounded up
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}-{hours:02d}:{rest // 60:02d}:00" if days else f"{hours}:{rest // 60:02d}:00"


# The batch script exports what the primary must leave free at the job's end: the lead and
# the minute SLURM may signal early (runner/sbatch.py, margins()).
MARGIN_ENV = "AUTOMLPERF_JOB_MARGIN_S"


@dataclass
class JobLimit:
    """The batch job's own time: when it started and when its scheduler (SLURM here;
    runner/joblimits.py for the others) ends it; a session must be over ``margin_s`` before
    the end."""

    started_at: float
    ends_at: float
    margin_s: float
    scheduler: str = "slurm"
    # A job of a chain (runner/chain.py) runs what it can of the run; the next job goes on.
    chain_link: bool = False

    def describe(self) -> dict[str, float | str | bool]:
        """What system.json records of the limit the run was held to."""
        described: dict[str, float | str | bool] = {
            "scheduler": self.scheduler, "started_at": round(self.started_at, 3),
            "ends_at": round(self.ends_at, 3), "margin_s": self.margin_s}
        if self.chain_link:
            described["chain_link"] = True
        return described

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
