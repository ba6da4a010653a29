"""Commands that run the benchmark: the primary, a replica, and a SLURM batch script."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from automlperf.cli.common import app, err, out, say_error, user_errors
from automlperf.errors import UserError


@app.command()
@user_errors
def run(
    config: Annotated[Optional[Path], typer.Option(help="TOML configuration.")] = None,
    duration: Annotated[Optional[str], typer.Option(help="Run length, e.g. 10m, 2h "
                                                    "(default: the dataset's preset).")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="builtin (default), digits, imagenet, cifar10, "
                                                   "synthetic.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Dataset folder.")] = None,
    replicas: Annotated[Optional[int], typer.Option(min=1, help="Local replica processes.")] = None,
    devices_per_replica: Annotated[Optional[int], typer.Option(min=1)] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="Where the run is written "
                                                    "(default runs/<date-time>).")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store URL, e.g. postgresql://user@host/db "
                                                 "(password from AUTOMLPERF_STORE_PASSWORD); "
                                                 "default RUN_DIR/history.db.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the interrupted run in --run-dir.")] = False,
    launcher: Annotated[str, typer.Option(help="local: replicas as processes here; slurm: one "
                                          "replica per node of the SLURM job; external: start "
                                          "none, the site's launcher runs `automlperf worker` "
                                          "--replicas times.")] = "local",
) -> None:
    """Run the benchmark: launch replicas, stop at the deadline, score, write the report."""
    from automlperf.runner.primary import RunRequest, run_benchmark
    from automlperf.report.console import summary

    outcome = run_benchmark(RunRequest(config, duration, dataset, data_dir, replicas,
                                       devices_per_replica, run_dir, store, resume, launcher), err)
    out.print(summary(outcome.result, outcome.run_dir))
    out.print(f"result: {outcome.result_path}", highlight=False)
    for what, where in outcome.written.items():
        out.print(f"{what}: {where}", highlight=False)
    for problem in outcome.problems:
        err.print(problem, highlight=False)
    if outcome.state == "failed":
        say_error(f"the run cannot train: {outcome.reason}")
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
) -> None:
    """Run one replica: generate, train and record candidates until the deadline. Its index
    comes from --replica-index or the launcher's rank variable (PMIX_RANK,
    OMPI_COMM_WORLD_RANK, PMI_RANK, PALS_RANKID, FLUX_TASK_RANK, JOB_COMPLETION_INDEX, SLURM)."""
    from automlperf.runner.worker import run_worker

    raise typer.Exit(run_worker(run_dir, store, replica_index, devices, threads, monitor, wait))


@app.command()
@user_errors
def slurm(
    nodes: Annotated[int, typer.Option(min=1, help="Nodes: one replica on each.")],
    duration: Annotated[str, typer.Option(help="Run length, e.g. 2h.")],
    run_dir: Annotated[Path, typer.Option(help="Run directory on the shared filesystem.")],
    gpus_per_node: Annotated[int, typer.Option(min=0, help="GPUs per node (0: CPU nodes).")] = 0,
    cpus_per_task: Annotated[Optional[int], typer.Option(min=1, help="CPU cores per replica "
                                                         "(default: every core the job holds on its node).")] = None,
    exclusive: Annotated[bool, typer.Option(
        "--exclusive/--shared-nodes", help="Whole nodes, with all their memory (default), or "
        "share them as the site allows (then set --cpus-per-task and memory with --sbatch, "
        "e.g. --sbatch=--mem-per-cpu=4G).")] = True,
    store: Annotated[Optional[str], typer.Option(help="PostgreSQL URL; default: a private "
                                                 "server in the run directory.")] = None,
    partition: Annotated[Optional[str], typer.Option()] = None,
    account: Annotated[Optional[str], typer.Option()] = None,
    time_limit: Annotated[Optional[str], typer.Option(help="Job time limit (default: duration "
                                                      "plus a margin to write the result).")] = None,
    config: Annotated[Optional[Path], typer.Option(help="TOML configuration.")] = None,
    sbatch_option: Annotated[Optional[list[str]], typer.Option(
        "--sbatch", help="Extra #SBATCH line, e.g. --sbatch=--qos=high (repeatable).")] = None,
    container_image: Annotated[Optional[str], typer.Option(
        help="Run each node's replica in this image: an enroot/pyxis image "
             "(nvcr.io#nvidia/pytorch:25.01-py3, a .sqsh file) or an Apptainer .sif.")] = None,
    container_runtime: Annotated[str, typer.Option(help="pyxis (srun --container-image) or "
                                                   "apptainer (srun apptainer exec).")] = "pyxis",
    container_mount: Annotated[Optional[list[str]], typer.Option(
        help="SRC:DST mounted in the container besides the run directory, e.g. the dataset "
             "(repeatable).")] = None,
    container_option: Annotated[Optional[list[str]], typer.Option(
        help="Extra option for the runtime, e.g. --container-option=--nv for Apptainer on "
             "NVIDIA GPUs, --rocm on AMD (repeatable).")] = None,
    submit: Annotated[bool, typer.Option(help="Submit the script with sbatch.")] = False,
    test_only: Annotated[bool, typer.Option(help="Ask sbatch to validate it, not run it.")] = False,
) -> None:
    """Write a SLURM batch script into the run directory (and submit it with --submit)."""
    from automlperf.config import Config, parse_duration
    from automlperf.runner.slurm import Container, ScriptOptions, submit as sbatch, write_script
    from automlperf.store.urls import resolve_store_url

    seconds = parse_duration(duration)
    limit = parse_duration(time_limit) if time_limit else None
    if config is not None:
        Config.load(config)  # a broken file is refused here, not in the queue
    url = resolve_store_url(store)
    box = None
    if container_image is not None:
        box = Container(container_runtime, container_image, container_mount or [],
                        container_option or [])
    elif container_mount or container_option:
        raise UserError("--container-mount and --container-option need --container-image")
    script = write_script(ScriptOptions(
        run_dir=run_dir, nodes=nodes, duration_s=seconds, gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task, store_url=url, partition=partition, account=account,
        time_limit_s=limit, config=config, sbatch_extra=sbatch_option or [], container=box,
        exclusive=exclusive))
    out.print(f"batch script: {script}", highlight=False)
    if test_only:
        out.print(sbatch(script, test_only=True), highlight=False)
    elif submit:
        job = sbatch(script)
        out.print(f"submitted job {job}; output: {run_dir.resolve()}/logs/slurm-{job}.out",
                  highlight=False)
    else:
        out.print(f"submit it with: sbatch {script}", highlight=False)
