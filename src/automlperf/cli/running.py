"""Commands that run the benchmark: the primary, a replica, and a SLURM batch script."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from automlperf.cli.common import app, err, out, say_error, user_errors
from automlperf.errors import UserError

if TYPE_CHECKING:
    from automlperf.runner.chain import ChainPlan


CONFIG = typer.Option(help="TOML configuration, or the name of one shipped with automlperf: "
                      "official (ImageNet-1k, every rule enforced before the clock starts).")
UNOFFICIAL = typer.Option(help="Run on data (or settings) that an official run refuses, as an "
                          "unofficial run: the result says so.")
SMALL_TASK = typer.Option(help="Run the built-in or digits task on several nodes anyway (a check "
                          "of the cluster's plumbing, not a benchmark of it).")


@app.command()
@user_errors
def run(
    config: Annotated[Optional[Path], CONFIG] = None,
    duration: Annotated[Optional[str], typer.Option(help="Run length, e.g. 10m, 2h "
                                                    "(default: the dataset's preset).")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="builtin (default), digits, imagenet, cifar10, "
                                                   "synthetic.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Dataset folder: for imagenet the "
                                                     "official ILSVRC-2012 archives (an official "
                                                     "run), or an image folder.")] = None,
    replicas: Annotated[Optional[int], typer.Option(min=1, help="Local replica processes.")] = None,
    devices_per_replica: Annotated[Optional[int], typer.Option(min=1)] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="Where the run is written "
                                                    "(default runs/<date-time>).")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store URL, e.g. postgresql://user@host/db "
                                                 "(password from AUTOMLPERF_STORE_PASSWORD); "
                                                 "default RUN_DIR/history.db.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --run-dir; with --duration, "
                                         "extend it (finished or not) to that longer "
                                         "length.")] = False,
    launcher: Annotated[str, typer.Option(help="local: replicas as processes here; slurm: one "
                                          "replica per node of the SLURM job; external: start "
                                          "none, the site's launcher runs `automlperf worker` "
                                          "--replicas times.")] = "local",
    unofficial: Annotated[bool, UNOFFICIAL] = False,
    small_task: Annotated[bool, SMALL_TASK] = False,
) -> None:
    """Run the benchmark: launch replicas, stop at the deadline, score, write the report."""
    from automlperf.runner.primary import RunRequest, run_benchmark
    from automlperf.report.console import summary

    outcome = run_benchmark(RunRequest(
        config=config, duration=duration, dataset=dataset, data_dir=data_dir, replicas=replicas,
        devices_per_replica=devices_per_replica, run_dir=run_dir, store=store, resume=resume,
        launcher=launcher, unofficial=unofficial, small_task=small_task), err)
    out.print(summary(outcome.result, outcome.run_dir))
    out.print(f"result: {outcome.result_path}", highlight=False)
    for what, where in outcome.written.items():
        out.print(f"{what}: {where}", highlight=False)
    for problem in outcome.problems:
        err.print(problem, highlight=False)
    if outcome.state == "failed":
        say_error(f"the run cannot train: {outcome.reason}")
    elif outcome.state == "interrupted" and outcome.chain_link:
        err.print("stopped at this job's time limit: the chain's next job goes on with the "
                  "run", highlight=False)
    elif outcome.state == "interrupted":
        err.print(f"interrupted: continue with `automlperf run --resume --run-dir "
                  f"{outcome.run_dir}`", highlight=False)
    raise typer.Exit(outcome.exit_code)


@app.command()
@user_errors
def worker(
    run_dir: Annotated[Path, typer.Option(help="The run directory (shared filesystem).")],
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
    replica_index: Annotated[Optional[int], typer.Option(min=0, help="This replica's number "
                                                         "(default: from the launcher).")] = None,
    devices: Annotated[Optional[int], typer.Option(min=1, help="Accelerators to use "
                                                   "(default all visible).")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="CPU cores to use (default "
                                                   "SLURM_CPUS_PER_TASK or all).")] = None,
    monitor: Annotated[bool, typer.Option(help="Sample this node's resources (one sampler "
                                          "per node).")] = True,
    wait: Annotated[float, typer.Option(min=0, help="Seconds to wait for the primary to open "
                                        "the run's session (replicas started by a site "
                                        "launcher may come first).")] = 300.0,
    require_accelerators: Annotated[bool, typer.Option(
        help="Stop, naming why, when no accelerator is visible, rather than train on the "
             "CPUs (set by `automlperf slurm --gpus-per-node N`).")] = False,
    retired_status: Annotated[int, typer.Option(
        min=0, max=255, help="Exit status of a replica that retires (its node cannot train: "
        "said in its log and recorded for the primary, and the run goes on without it). 0 "
        "under a launcher that ends every rank when one exits non-zero (mpirun, mpiexec).")] = 1,
    data_root: Annotated[Optional[Path], typer.Option(
        help="Where this replica sees the run's dataset, if not at the run's path: a "
             "container's mount of it (set by `automlperf slurm --container-image`).")] = None,
) -> None:
    """Run one replica: generate, train and record candidates until the deadline. Its index
    comes from --replica-index or the launcher's rank variable (PMIX_RANK,
    OMPI_COMM_WORLD_RANK, PMI_RANK, PALS_RANKID, FLUX_TASK_RANK, JOB_COMPLETION_INDEX, SLURM)."""
    from automlperf.runner.worker import run_worker

    raise typer.Exit(run_worker(run_dir, store, replica_index, devices, threads, monitor, wait,
                                require_accelerators, retired_status, data_root))


@app.command()
@user_errors
def stage(
    run_dir: Annotated[Path, typer.Option(help="The run directory (shared filesystem) that "
                                          "`automlperf slurm` wrote.")],
    to: Annotated[Path, typer.Option(help="This node's own storage (e.g. /local/scratch): "
                                     "the copy goes in a folder of the run's name there.")],
    threads: Annotated[int, typer.Option(min=1, help="Files of a folder copied at once (the "
                                         "archives are copied one after the other).")] = 16,
    clean: Annotated[bool, typer.Option(help="Remove this node's copy instead (the job's "
                                        "end).")] = False,
) -> None:
    """Copy the run's dataset to this node's storage before the clock, check it, and record
    it: the node's replica then reads the copy, not the shared file system. The official
    archives are copied one after the other, their MD5s computed on the way and the copy
    read back from the disk; a folder file by file. `automlperf slurm --stage-to DIR` runs
    it on every node of the job."""
    from automlperf.runner.staging import clean as remove, stage as copy

    if clean:
        removed = remove(run_dir, to)
        out.print("removed this node's copy of the dataset" if removed
                  else "no copy of the dataset on this node", highlight=False)
        return
    done = copy(run_dir, to, threads)
    if done.get("kind") == "archives":
        out.print(f"{done['node']}: the archives ({done['bytes'] / 1e9:.2f} GB, "
                  f"{done['copied_bytes'] / 1e9:.2f} GB copied in {done['copy_s']:.1f} s, read "
                  f"back in {done['verify_s']:.1f} s) staged in {done['root']} in "
                  f"{done['staging_s']:.1f} s; MD5s "
                  + ", ".join(f"{a['name']} {a['md5']}" for a in done["archives"].values()),
                  highlight=False, soft_wrap=True)
        return
    out.print(f"{done['node']}: {done['files']:,} files ({done['bytes'] / 1e9:.2f} GB, "
              f"{done['copied_bytes'] / 1e9:.2f} GB copied) staged in {done['root']} in "
              f"{done['staging_s']:.1f} s; {done['sample']} compared with the originals",
              highlight=False)


@app.command()
@user_errors
def slurm(
    run_dir: Annotated[Path, typer.Option(help="Run directory on the shared filesystem.")],
    nodes: Annotated[Optional[int], typer.Option(min=1, help="Nodes: one replica on each.")] = None,
    duration: Annotated[Optional[str], typer.Option(help="Run length, e.g. 2h (default: the "
                                                    "configuration's).")] = None,
    config: Annotated[Optional[Path], CONFIG] = None,
    dataset: Annotated[Optional[str], typer.Option(help="imagenet, cifar10, builtin (default), "
                                                   "digits, synthetic.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Dataset folder, at the path the "
                                                     "compute nodes see it: the official "
                                                     "ILSVRC-2012 archives (proven by every "
                                                     "session of the job), or an image folder "
                                                     "(scanned once, now).")] = None,
    unofficial: Annotated[bool, UNOFFICIAL] = False,
    small_task: Annotated[bool, SMALL_TASK] = False,
    gpus_per_node: Annotated[Optional[int], typer.Option(
        min=0, help="GPUs per node (default 0: CPU nodes; an official run must name them); "
                    "a replica that sees none stops, saying why.")] = None,
    cpus_per_task: Annotated[Optional[int], typer.Option(min=1, help="CPU cores per replica "
                                                         "(default: every core the job holds on its node).")] = None,
    exclusive: Annotated[Optional[bool], typer.Option(
        "--exclusive/--shared-nodes", help="Whole nodes, with all their memory (default), or "
        "share them as the site allows (then set --cpus-per-task and memory with --sbatch, "
        "e.g. --sbatch=--mem-per-cpu=4G).")] = None,
    store: Annotated[Optional[str], typer.Option(help="PostgreSQL URL; default: a private "
                                                 "server in the run directory.")] = None,
    partition: Annotated[Optional[str], typer.Option()] = None,
    account: Annotated[Optional[str], typer.Option()] = None,
    time_limit: Annotated[Optional[str], typer.Option(help="Job time limit (default: a start-up "
                                                      "allowance, the duration, and the time "
                                                      "to write the result).")] = None,
    sbatch_option: Annotated[Optional[list[str]], typer.Option(
        "--sbatch", help="Extra #SBATCH line, e.g. --sbatch=--qos=high (repeatable).")] = None,
    container_image: Annotated[Optional[str], typer.Option(
        help="Run each node's replica in this image: an enroot/pyxis image (a .sqsh file "
             "imported from examples/container/Dockerfile) or an Apptainer .sif.")] = None,
    container_runtime: Annotated[Optional[str], typer.Option(
        help="pyxis (srun --container-image, the default) or apptainer (srun apptainer "
             "exec).")] = None,
    container_mount: Annotated[Optional[list[str]], typer.Option(
        help="SRC:DST mounted in the container besides the run directory, e.g. the dataset "
             "(repeatable).")] = None,
    container_option: Annotated[Optional[list[str]], typer.Option(
        help="Extra option for the runtime, e.g. --container-option=--nv for Apptainer on "
             "NVIDIA GPUs, --rocm on AMD (repeatable).")] = None,
    stage_to: Annotated[Optional[Path], typer.Option(
        help="Node-local storage (e.g. /local/scratch) every node copies the dataset to before "
             "the clock; the replicas then read it there, not from the shared file system "
             "(recommended beyond a few nodes).")] = None,
    stage_time: Annotated[Optional[str], typer.Option(
        help="Time the job gives the staging (default 20m; each node's copy is cut off "
             "after it). With --resume, the resubmitted job's.")] = None,
    startup_time: Annotated[Optional[str], typer.Option(
        help="Time the job gives its start-up before the clock (default 5m; a pilot's "
             "report shows what it took). --resume gives twice what the run's first job "
             "took.")] = None,
    chain: Annotated[bool, typer.Option(
        help="Split a run longer than --time-limit (default: the partition's maximum time) "
             "into a chain of jobs of that limit, each going on where the last stopped; the "
             "job that ends the run cancels the rest.")] = False,
    exclude_bad_nodes: Annotated[bool, typer.Option(
        help="Leave out of the run the nodes the health sweep before the clock finds unable "
             "to train (too few GPUs, ECC errors, no staging folder, no data, no image); "
             "without it they are named and their replicas retire.")] = False,
    resume: Annotated[bool, typer.Option(help="Submit the run in --run-dir again, with a time "
                                         "limit sized to the time it still needs, and its "
                                         "options but for --partition, --account, "
                                         "--time-limit, --sbatch and --stage-time given now; "
                                         "--duration extends it to that longer length, when "
                                         "the job starts its clock.")] = False,
    submit: Annotated[bool, typer.Option(help="Submit the script with sbatch.")] = False,
    test_only: Annotated[bool, typer.Option(help="Ask sbatch to validate it, not run it.")] = False,
) -> None:
    """Write a SLURM batch script into the run directory (and submit it with --submit)."""
    from automlperf.runner.resubmit import refuse_changes, resume_job
    from automlperf.runner.sbatch import SlurmRequest, submit as sbatch, write_batch_job

    if resume:
        refuse_changes({
            "--nodes": nodes, "--config": config, "--dataset": dataset, "--data-dir": data_dir,
            "--store": store, "--gpus-per-node": gpus_per_node, "--cpus-per-task": cpus_per_task,
            "--exclusive/--shared-nodes": exclusive, "--container-image": container_image,
            "--container-runtime": container_runtime, "--container-mount": container_mount or None,
            "--container-option": container_option or None, "--stage-to": stage_to,
            "--startup-time": startup_time, "--unofficial": unofficial or None,
            "--small-task": small_task or None, "--exclude-bad-nodes": exclude_bad_nodes or None})
        again = resume_job(run_dir, time_limit, partition, account, sbatch_option, duration,
                           chain=chain, stage_time=stage_time)
        out.print(again.line(), highlight=False)
        script, plan, options, exports = again.script, again.chain, again.options, again.exports
    else:
        if nodes is None:
            raise UserError("--nodes is needed to write a new script (or pass --resume)")
        written, settings = write_batch_job(SlurmRequest(
            run_dir=run_dir, nodes=nodes, duration=duration, config=config, dataset=dataset,
            data_dir=data_dir, unofficial=unofficial, small_task=small_task,
            gpus_per_node=gpus_per_node or 0, cpus_per_task=cpus_per_task,
            exclusive=exclusive is not False, store=store, partition=partition,
            account=account, time_limit=time_limit, sbatch_extra=sbatch_option or [],
            container_image=container_image, container_runtime=container_runtime or "pyxis",
            container_mounts=container_mount or [], container_options=container_option or [],
            stage_to=stage_to, stage_time=stage_time, startup_time=startup_time, chain=chain,
            exclude_bad_nodes=exclude_bad_nodes))
        for line in written.lines(settings):
            out.print(line, highlight=False, soft_wrap=True)
        script, plan, options, exports = written.script, written.chain, [], None
    if plan is not None:
        _submit_chain(script, run_dir, plan, options, sbatch, submit, test_only, exports)
    else:
        _submit(script, run_dir, sbatch, submit, test_only, options)


@app.command("job-time")
@user_errors
def job_time(
    duration: Annotated[Optional[str], typer.Option(help="Run length, e.g. 4h (default: the "
                                                    "configuration's).")] = None,
    config: Annotated[Optional[Path], CONFIG] = None,
    dataset: Annotated[Optional[str], typer.Option(help="The dataset whose preset to use "
                                                   "without --config.")] = None,
    scheduler: Annotated[str, typer.Option(help="How to write it: slurm (H:MM:SS), pbs "
                                           "(walltime HH:MM:SS), lsf (bsub -W H:MM), flux "
                                           "(-t Nm).")] = "slurm",
    stage_time: Annotated[Optional[str], typer.Option(
        help="Time the job also gives copying the data to every node.")] = None,
    scan_time: Annotated[Optional[str], typer.Option(
        help="Time the job also gives scanning the data before the clock: the PBS, LSF and "
             "Flux examples scan it inside the job (minutes for ImageNet on a parallel file "
             "system); `automlperf slurm` scans it at submission.")] = None,
) -> None:
    """Print the time limit a batch job needs for a run: the start-up before the clock, the
    run, the grace for its epochs in flight and the result. E.g. qsub -l walltime=$(automlperf
    job-time --duration 4h --scheduler pbs) automlperf.pbs"""
    from automlperf.config import ConfigError, parse_duration
    from automlperf.runner.joblimits import SCHEDULERS, job_time as needed, scheduler_time
    from automlperf.settings import settings_from_options

    if scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler {scheduler}: one of {', '.join(SCHEDULERS)}")
    allowances = []
    for name, given in (("--stage-time", stage_time), ("--scan-time", scan_time)):
        try:
            allowances.append(parse_duration(given) if given else 0.0)
        except ConfigError as exc:
            raise UserError(f"{name}: {exc}") from None
    settings = settings_from_options(config, dataset, duration=duration, data_required=False)
    held = needed(settings, *allowances)
    print(scheduler_time(held.limit_s, scheduler))
    err.print(f"start-up {held.startup_s / 60:.0f} min, run {held.duration_s / 60:.0f} min, "
              f"epochs in flight {held.grace_s / 60:.0f} min, result {held.result_s / 60:.0f} "
              "min", highlight=False)


def _submit_chain(script: Path, run_dir: Path, plan: ChainPlan, options: list[str], sbatch,
                  submit: bool, test_only: bool, exports: dict[str, str] | None = None) -> None:
    from automlperf.runner.chain import link_options, submit_chain

    out.print(f"{plan.describe()}", highlight=False)
    if submit and not test_only:
        jobs = submit_chain(script, plan, options, sbatch, exports)
        out.print(f"batch script: {script}\nsubmitted jobs {' '.join(jobs)} (each after the "
                  f"last; listed in {run_dir.resolve()}/chain.jobs); output: "
                  f"{run_dir.resolve()}/logs/slurm-<jobid>.out", highlight=False)
        return
    first = [*link_options(plan, exports), *options]
    if test_only:
        _submit(script, run_dir, sbatch, False, True, first)
        return
    out.print(f"batch script: {script}\nsubmit the chain with: automlperf slurm --resume --chain "
              f"--time-limit {int(plan.limit_s // 60)}m --run-dir {run_dir} --submit",
              highlight=False)


def _submit(script: Path, run_dir: Path, sbatch, submit: bool, test_only: bool,
            options: list[str]) -> None:
    out.print(f"batch script: {script}", highlight=False)
    if test_only:
        out.print(sbatch(script, test_only=True, options=options), highlight=False)
    elif submit:
        job = sbatch(script, options=options)
        out.print(f"submitted job {job}; output: {run_dir.resolve()}/logs/slurm-{job}.out",
                  highlight=False)
    else:
        shown = " ".join([*options, str(script)])
        out.print(f"submit it with: sbatch {shown}", highlight=False)
