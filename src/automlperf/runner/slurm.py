"""SLURM inside the job: the job's environment (its nodes, this replica's index, the job's
time limit) and the launcher that starts one replica per node as a job step. The batch script
that submits the job is written by runner/sbatch.py, on the login node.

Everything a replica needs to know about itself comes from SLURM's environment: the node
count and node list of the job, its node's name, the GPUs bound to its step.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from automlperf.data_manifest import file_sha256
from automlperf.errors import UserError
from automlperf.runner.launch import terminate, worker_command
from automlperf.store.rundir import write_atomic


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
            self.digest = "sha256:" + file_sha256(self.image)
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

    def wrap(self, run_dir: Path, srun_args: list[str], worker: list[str]) -> list[str]:
        """An srun command that runs ``worker`` (whose first word is the host's Python)
        inside the image, reading the dataset where the image sees it."""
        inner = [self.python, *worker[1:]]
        if self.data_root is not None:
            inner += ["--data-root", self.data_root]
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
                   # A resumed or requeued run adds to its replicas' logs.
                   "--open-mode=append", *memory]
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
