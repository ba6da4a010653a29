"""The SLURM batch script, written on the login node by ``automlperf slurm``: its time limit
(the start-up, the run, the grace for epochs in flight, the time to write the result), the
checks that refuse a job before it queues, the dataset scanned once for the job, and its
submission with ``sbatch`` (again, to resume an interrupted run, or as a chain of jobs:
runner/resubmit.py, runner/chain.py).

Inside the job, the script runs ``automlperf run --launcher slurm``, whose launcher and view
of the job's environment are in runner/slurm.py. The template is runner/sbatch.sh.j2.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from automlperf.config import Config, parse_duration
from automlperf.dataset.index import ARCHIVES
from automlperf.dataset.shared import SHARED_INDEX
from automlperf.runner.chain import ChainPlan, chain_limit, plan_chain
from automlperf.runner.health import EXCLUDE_ENV, SWEEP_S
from automlperf.runner.joblimits import (CHAIN_ENV, CHAIN_FILE, EXTEND_ENV, LINK_MARGIN_ENV,
                                         OVER_FILE, STAGE_ENV, STARTUP_S, link_lead, margins)
from automlperf.runner.session import record_origin
from automlperf.errors import UserError
from automlperf.runner.slurm import (MARGIN_ENV, PYXIS_NAME, Container, SlurmError, format_time,
                                     require)
from automlperf.settings import check_cluster_task, settings_from_options
from automlperf.store import connections
from automlperf.store.pgserver import find_binaries
from automlperf.store.rundir import write_atomic
from automlperf.store.urls import redact, resolve_store_url, split_password


# The least start-up a time limit the user gives must leave room for: twice the measured.
MIN_STARTUP_S = 60.0
# What the job gives staging a folder on every node (--stage-to) by default, before the
# start-up: ImageNet-1k's 140 GB at about 150 MB/s per node from the shared file system.
STAGE_S = 1200.0
# The official archives are read at the MD5's pace (one stream, one core: 0.55 GB per
# CPU-second on this project's EPYC, bench/RESULTS.md, "ImageNet read from its archives"); the
# job assumes PROOF_RATE for every session's proof before its clock. Staging copies them to
# every node at the slower of that pace and the shared file system's SHARED_RATE split over
# the nodes (an assumption: a parallel file system's aggregate read rate), then reads each
# copy back at VERIFY_RATE, with STAGE_MARGIN ("Staging that fits 512 nodes").
PROOF_RATE, VERIFY_RATE, SHARED_RATE = 400e6, 1e9, 100e9
STAGE_MARGIN, MIN_STAGE_S = 1.25, 300.0
# The staging step's CPUs on each node: one reads and writes, one computes the MD5s (the
# script asks for fewer where the job holds fewer on the node).
STAGE_CPUS = 2


def stage_allowance(archive_bytes: int, nodes: int = 1) -> float:
    """What the job gives staging the archives on every node (runner/staging.py)."""
    copy = max(archive_bytes / PROOF_RATE, nodes * archive_bytes / SHARED_RATE)
    return max(MIN_STAGE_S, STAGE_MARGIN * (copy + archive_bytes / VERIFY_RATE))


@dataclass
class ScriptOptions:
    run_dir: Path
    nodes: int
    duration_s: float
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    store_url: str | None = None
    partition: str | None = None
    account: str | None = None
    time_limit_s: float | None = None
    settings: Config | None = None  # the run's configuration, resolved; None: the default
    job_name: str | None = None  # default automlperf-<the run directory's name>
    sbatch_extra: list[str] = field(default_factory=list)
    container: Container | None = None
    # The whole node for each replica (a benchmark shares no node's CPUs, memory or GPUs);
    # False leaves the node's sharing to the site and to --cpus-per-task and --sbatch.
    exclusive: bool = True
    small_task: bool = False  # the built-in or digits task on several nodes, asked for
    # Node-local storage each node copies the dataset to before the clock (runner/staging.py),
    # and the time the job gives that.
    stage_to: Path | None = None
    stage_s: float | None = None  # None: sized by the data (stage_allowance, or STAGE_S)
    startup_allowance_s: float = STARTUP_S  # the start-up before the clock, staging aside
    # Added to the start-up: every session proves the official archives before its clock.
    proof_s: float = 0.0
    # A run longer than time_limit_s split into a chain of jobs of that limit (chain.py).
    chain: bool = False
    # Leave the nodes the health sweep finds unable to train out of the run (health.py).
    exclude_bad_nodes: bool = False

    def name(self) -> str:
        """The job's name: the run's, so that squeue and sacct tell a site's runs apart."""
        if self.job_name:
            return self.job_name
        return "automlperf-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", self.run_dir.resolve().name)
                                .strip("-") or "run")

    def startup_s(self) -> float:
        """What the job gives before the clock: the start-up (the archives' proof with it),
        and the staging."""
        stage = STAGE_S if self.stage_s is None else self.stage_s
        return self.startup_allowance_s + self.proof_s + (stage if self.stage_to is not None else 0.0)

    def all_memory(self) -> bool:
        """Ask for all of each node's memory (``--mem=0``): on whole nodes, unless the user
        sets the job's memory (sbatch refuses --mem beside --mem-per-cpu/--mem-per-gpu)."""
        return self.exclusive and not any(re.match(r"--mem(-per-(cpu|gpu))?(=|\s|$)", extra.strip())
                                          for extra in self.sbatch_extra)

    def grace_s(self) -> float:
        """The grace the run gives epochs in flight at its deadline (Config.deadline_grace),
        which the job outlives it by: that of its settings, or of the default configuration
        for this duration."""
        settings = self.settings
        if settings is None:
            settings = Config.parse({"run": {"duration_s": self.duration_s}})
        return settings.deadline_grace()

    def longest_duration(self, time_limit_s: float) -> float:
        """The longest run whose clock a job of ``time_limit_s`` can start: room for the
        least start-up (staging and the archives' proof added), the run, its grace and two
        minutes to write the result."""
        room = time_limit_s - MIN_STARTUP_S - (self.startup_s() - self.startup_allowance_s) - 120
        low, high = 0.0, max(0.0, room)
        for _ in range(60):  # the grace grows with the duration: bisect
            middle = (low + high) / 2
            trial = ScriptOptions(self.run_dir, self.nodes, middle, settings=None if
                                  self.settings is None else self.settings.model_copy(
                                      update={"run": self.settings.run.model_copy(
                                          update={"duration_s": middle})}))
            low, high = (middle, high) if middle + trial.grace_s() <= room else (low, middle)
        return low


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 else f"{int(seconds)}s"


@dataclass
class Written:
    """A batch script written, and what sized its time limit."""

    script: Path
    time_limit_s: float
    signal_lead_s: int
    startup_s: float
    dataset: dict[str, Any] | None = None  # the dataset index saved at submission
    chain: ChainPlan | None = None  # the jobs a chain submits, each of time_limit_s
    proof_s: float = 0.0  # of the start-up: the archives' proof before each session's clock
    container: Container | None = None  # the image the replicas run in

    def lines(self, settings: Config) -> list[str]:
        """What was written, for the one who asked: the dataset as the job will have it,
        the image, and how the time limit divides."""
        out = []
        d = self.dataset
        if d and d.get("archives"):
            out.append(f"dataset: the official archives in {d['archives']} "
                       f"({d['archive_bytes'] / 1e9:.1f} GB): every session of the job proves "
                       f"them before its clock (its start-up holds {self.proof_s:.0f} s for it)")
        elif d:
            out.append(f"dataset: {d['files']:,} files scanned in {d['scan_s']:.1f} s; index "
                       f"saved in {d['index']} for the job"
                       + (f" (not ImageNet-1k: {'; '.join(d['problems'])})" if d["problems"]
                          else ""))
        box = self.container
        if box is not None:
            out.append(f"container image {box.image}: " + (
                f"digest {box.digest}" if box.digest else "named by a tag alone; pin it by "
                "digest (NAME@sha256:...) for the result to name the exact image"))
        out.append(f"time limit {format_time(self.time_limit_s)}: start-up "
                   f"{self.startup_s / 60:.0f} min, run {settings.run.duration_s / 60:.0f} min, "
                   f"epochs in flight {settings.deadline_grace() / 60:.0f} min, "
                   f"result {(self.signal_lead_s + 60) / 60:.0f} min")
        return out


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
        settings.check_official()
        check_cluster_task(settings, opts.nodes, opts.small_task)
        if settings.run.require_accelerators and not opts.gpus_per_node:
            raise SlurmError("this configuration trains on accelerators only ([run] "
                             "require_accelerators, as an official run does): pass "
                             "--gpus-per-node N, the GPUs of each node, or every replica "
                             "would stop in the job for want of one")
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
    grace = opts.grace_s()
    if opts.stage_to is not None and dataset is None:
        raise SlurmError("--stage-to copies the dataset to the nodes: give --dataset imagenet "
                         "--data-dir DIR (or --config official --data-dir DIR)")
    if dataset is not None and dataset.get("archive_bytes"):
        opts.proof_s = math.ceil(dataset["archive_bytes"] / PROOF_RATE)
        if opts.stage_s is None:
            opts.stage_s = math.ceil(stage_allowance(dataset["archive_bytes"], opts.nodes))
    if opts.stage_s is None:
        opts.stage_s = STAGE_S
    limit, lead = margins(opts.duration_s + grace, opts.startup_s())
    chain = None
    if opts.chain:
        if opts.time_limit_s is None:
            raise SlurmError("--chain splits the run into jobs of --time-limit: give it")
        # Each job's lead is what writing the result takes, not a share of the whole run;
        # nothing is measured yet (a resubmitted chain's is: resubmit.py).
        lead = link_lead(None)
        chain = plan_chain(opts.duration_s + grace, opts.time_limit_s, opts.startup_s(), lead)
        limit = chain.limit_s
    elif opts.time_limit_s is not None:
        # The least start-up, and what comes before it whatever the start-up takes: staging,
        # and the archives' proof.
        before = opts.startup_s() - opts.startup_allowance_s
        need = MIN_STARTUP_S + before + opts.duration_s + grace + 120
        if opts.time_limit_s < need:
            longest = opts.longest_duration(opts.time_limit_s)
            holds = (f"it holds a --duration of at most {_minutes(longest)}, or pass --chain "
                     "to split the run into jobs of this limit" if longest >= 60
                     else "it holds no run")
            raise SlurmError(f"--time-limit {format_time(opts.time_limit_s)} leaves no room to "
                             f"start the clock of a {_minutes(opts.duration_s)} run: that "
                             f"needs at least {format_time(need)} (a start-up of "
                             f"{MIN_STARTUP_S + before:.0f} s"
                             + (" with the data's staging and proof" if before else "")
                             + f", the run, {grace:.0f} s of grace for the epochs in flight, 2 "
                             f"minutes to write the result); {holds}")
        limit = opts.time_limit_s
        lead = int(max(60, min(lead, limit - MIN_STARTUP_S - before - opts.duration_s - grace - 60)))
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
    text = env.get_template("sbatch.sh.j2").render(
        written=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), script=script,
        run_dir=run_dir, nodes=opts.nodes, gpus_per_node=opts.gpus_per_node,
        cpus_per_task=opts.cpus_per_task, time_limit=format_time(limit), signal_s=lead,
        margin_s=lead + 60, margin_env=MARGIN_ENV, chain_env=CHAIN_ENV,
        link_margin_env=LINK_MARGIN_ENV,
        chain_file=CHAIN_FILE, over_file=OVER_FILE,
        partition=opts.partition, account=opts.account, job_name=opts.name(),
        sbatch_extra=opts.sbatch_extra, python=sys.executable, store_url=store_url,
        store_shown=redact(store_url) if store_url else None, password_file=password_file,
        run_args=" ".join(run_args), container=opts.container, pyxis_name=PYXIS_NAME, exclusive=opts.exclusive,
        all_memory=opts.all_memory(), dataset=dataset, stage_to=opts.stage_to,
        stage_s=opts.stage_s, stage_cpus=STAGE_CPUS, stage_env=STAGE_ENV,
        startup_s=opts.startup_allowance_s + opts.proof_s, proof_s=opts.proof_s,
        extend_env=EXTEND_ENV, exclude_bad=opts.exclude_bad_nodes, exclude_env=EXCLUDE_ENV,
        sweep_s=SWEEP_S)
    write_atomic(script, text)
    script.chmod(0o750)
    return Written(script, limit, lead, opts.startup_s(), dataset, chain, opts.proof_s,
                   opts.container)


def _scan_dataset(settings: Config, run_dir: Path) -> dict[str, Any] | None:
    """Scan the run's image folder now and save its index in the run directory (see
    write_job); what was found, for the script's header and the command's output."""
    data_dir = settings.data.data_dir
    if settings.data.dataset != "imagenet" or data_dir is None:
        return None
    if not Path(data_dir).is_dir():
        raise SlurmError(f"{data_dir} is not readable here: `automlperf slurm` scans the dataset "
                         "once, before the job, so that the job's clock and time limit do not "
                         "pay for a million file look-ups; run it on a node that sees the data "
                         "at the path the compute nodes use (srun -N1 --pty automlperf slurm ...)")
    # The official archives are only seen to be there: every session of the job proves
    # them before its clock (144 GB at the MD5's pace is minutes, not a login node's work).
    origin = record_origin(settings, run_dir=run_dir, proof=False)
    identity = origin["dataset_identity"] or {}
    if identity.get("source") == ARCHIVES:
        return {"files": identity.get("files"), "classes": None, "fingerprint": None,
                "problems": [], "scan_s": 0.0, "index": None, "archives": str(data_dir),
                "archive_bytes": identity.get("bytes")}
    startup = origin.get("startup", {})
    unusable = startup.get("dataset_unusable") or (
        identity["problems"][0] if identity.get("layout") is None and identity.get("problems")
        else None)
    if unusable or startup.get("dataset_scan_s") is None:
        raise SlurmError(f"the job could not train on {data_dir}: "
                         f"{unusable or 'no file index could be built'}; fix the folder, or "
                         "pass the --data-dir of a dataset (class folders of images under "
                         "train/ and val/)")
    return {"files": identity.get("files"), "classes": identity.get("classes"),
            "fingerprint": identity.get("fingerprint"), "problems": identity.get("problems", []),
            "scan_s": startup.get("dataset_scan_s"), "index": str(run_dir / SHARED_INDEX)}


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


@dataclass(kw_only=True)
class SlurmRequest:
    """What ``automlperf slurm`` was asked for a new script; None leaves a setting to the
    configuration (or to SLURM)."""

    run_dir: Path
    nodes: int
    duration: str | None = None
    config: Path | None = None
    dataset: str | None = None
    data_dir: Path | None = None
    unofficial: bool = False
    small_task: bool = False  # the built-in or digits task on several nodes, asked for
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    exclusive: bool = True
    store: str | None = None
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    sbatch_extra: list[str] = field(default_factory=list)
    container_image: str | None = None
    container_runtime: str = "pyxis"
    container_mounts: list[str] = field(default_factory=list)
    container_options: list[str] = field(default_factory=list)
    stage_to: Path | None = None
    stage_time: str | None = None
    startup_time: str | None = None  # the start-up allowance (default STARTUP_S)
    chain: bool = False  # split the run into jobs of time_limit (or the partition's maximum)
    exclude_bad_nodes: bool = False  # leave out the nodes the health sweep finds bad


def write_batch_job(req: SlurmRequest) -> tuple[Written, Config]:
    """Write the request's batch script into its run directory: what was written, and the
    run's settings it was written for."""
    settings = settings_from_options(req.config, req.dataset, duration=req.duration,
                                     data_dir=req.data_dir, unofficial=req.unofficial)
    limit = parse_duration(req.time_limit) if req.time_limit else None
    if req.chain:
        limit = chain_limit(req.time_limit, req.partition)
    url = resolve_store_url(req.store)
    box = None
    if req.container_image is not None:
        box = Container(req.container_runtime, req.container_image, req.container_mounts,
                        req.container_options)
    elif req.container_mounts or req.container_options:
        raise UserError("--container-mount and --container-option need --container-image")
    stage_to = Path(os.path.abspath(req.stage_to)) if req.stage_to else None
    if box is not None:
        box.data_root = _data_inside(box, req.run_dir, settings, stage_to)
        box.pin()
    written = write_job(ScriptOptions(
        run_dir=req.run_dir, nodes=req.nodes, duration_s=settings.run.duration_s,
        gpus_per_node=req.gpus_per_node, cpus_per_task=req.cpus_per_task, store_url=url,
        partition=req.partition, account=req.account, time_limit_s=limit, settings=settings,
        sbatch_extra=req.sbatch_extra, container=box, exclusive=req.exclusive,
        small_task=req.small_task,
        stage_to=stage_to, stage_s=parse_duration(req.stage_time) if req.stage_time else None,
        startup_allowance_s=parse_duration(req.startup_time) if req.startup_time else STARTUP_S,
        chain=req.chain, exclude_bad_nodes=req.exclude_bad_nodes))
    return written, settings


def _data_inside(box: Container, run_dir: Path, settings: Config,
                 stage_to: Path | None) -> str | None:
    """Where the replicas in ``box`` read the run's dataset: the data folder as the image
    mounts it (the login node's path, with its symbolic links resolved, need not exist
    inside). A folder no mount holds, or node-local staging the image does not see at the
    same path, is refused in one line."""
    run_dir = Path(os.path.abspath(run_dir))
    if stage_to is not None and box.inside(run_dir, stage_to) != stage_to:
        raise UserError(f"--stage-to {stage_to} is not mounted at the same path in the "
                        f"container: add --container-mount {stage_to}:{stage_to}")
    data_dir = settings.data.data_dir
    if data_dir is None:
        return None
    inside = box.inside(run_dir, Path(data_dir))
    if inside is None:
        raise UserError(f"the data folder {data_dir} is not mounted in the container: add "
                        f"--container-mount {data_dir}:/data (the replicas then read /data)")
    return str(inside)
