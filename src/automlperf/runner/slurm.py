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

import jinja2

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
            worker = worker_command(self.run_dir, i, None, None)
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


def margins(duration_s: float) -> tuple[float, int]:
    """(time limit, signal lead) in seconds: the limit leaves room to stop and write the
    result; SLURM may signal up to a minute early, so the lead is a minute shorter than
    the margin and an early signal still lands after the run's own deadline."""
    margin = max(180.0, 0.05 * duration_s)
    return duration_s + margin, int(margin - 60)


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
    config: Path | None = None
    job_name: str = "automlperf"
    sbatch_extra: list[str] = field(default_factory=list)
    container: Container | None = None
    # The whole node for each replica (a benchmark shares no node's CPUs, memory or GPUs);
    # False leaves the node's sharing to the site and to --cpus-per-task and --sbatch.
    exclusive: bool = True

    def all_memory(self) -> bool:
        """Ask for all of each node's memory (``--mem=0``): on whole nodes, unless the user
        sets the job's memory (sbatch refuses --mem beside --mem-per-cpu/--mem-per-gpu)."""
        return self.exclusive and not any(re.match(r"--mem(-per-(cpu|gpu))?(=|\s|$)", extra.strip())
                                          for extra in self.sbatch_extra)


def write_script(opts: ScriptOptions) -> Path:
    """Write RUN_DIR/automlperf.sbatch (and the files it needs); return its path."""
    run_dir = opts.run_dir.resolve()
    if (run_dir / "run.json").exists():
        raise SlurmError(f"{run_dir} already holds a run; choose a new --run-dir")
    # Fail here, on the login node, rather than in the queue.
    if opts.store_url is None:
        find_binaries()
    else:
        connections.check_room(opts.store_url, opts.nodes)  # one replica per node
    run_dir.mkdir(parents=True, exist_ok=True)
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
        lead = int(min(lead, limit - opts.duration_s - grace - 60))
    if opts.container is not None:
        opts.container.save(run_dir)
    run_args = [f"--duration {int(opts.duration_s)}s"]
    if opts.config is not None:
        config_copy = run_dir / "submitted-config.toml"
        shutil.copyfile(opts.config, config_copy)
        run_args.insert(0, f"--config {shlex.quote(str(config_copy))}")
    env = jinja2.Environment(loader=jinja2.PackageLoader("automlperf.runner", "."),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    script = run_dir / "automlperf.sbatch"
    text = env.get_template("slurm.sh.j2").render(
        written=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), script=script,
        run_dir=run_dir, nodes=opts.nodes, gpus_per_node=opts.gpus_per_node,
        cpus_per_task=opts.cpus_per_task, time_limit=format_time(limit), signal_s=max(30, lead),
        partition=opts.partition, account=opts.account, job_name=opts.job_name,
        sbatch_extra=opts.sbatch_extra, python=sys.executable, store_url=store_url,
        store_shown=redact(store_url) if store_url else None, password_file=password_file,
        run_args=" ".join(run_args), container=opts.container, exclusive=opts.exclusive,
        all_memory=opts.all_memory())
    write_atomic(script, text)
    script.chmod(0o750)
    return script


def submit(script: Path, test_only: bool = False) -> str:
    """sbatch the script; the job id (or sbatch's verdict with ``test_only``)."""
    cmd = [require("sbatch")] + (["--test-only"] if test_only else ["--parsable"]) + [str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused {script}: {done.stderr.strip()}")
    if test_only:
        return done.stderr.strip() or done.stdout.strip()
    return done.stdout.strip().split(";")[0]
