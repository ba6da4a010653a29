"""What ``automlperf slurm`` asks, as one request, and the batch job written for it on the
login node: the run's settings built and checked there (a broken file, or an official run on
other data, is refused now, not in the queue), the store and the container resolved, and the
script written by runner/slurm.py's ``write_job``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from automlperf.config import Config, parse_duration
from automlperf.errors import UserError
from automlperf.runner.slurm import Container, ScriptOptions, Written, write_job
from automlperf.settings import settings_from_options
from automlperf.store.urls import resolve_store_url


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


def write_batch_job(req: SlurmRequest) -> tuple[Written, Config]:
    """Write the request's batch script into its run directory: what was written, and the
    run's settings it was written for."""
    settings = settings_from_options(req.config, req.dataset, duration=req.duration,
                                     data_dir=req.data_dir, unofficial=req.unofficial)
    limit = parse_duration(req.time_limit) if req.time_limit else None
    url = resolve_store_url(req.store)
    box = None
    if req.container_image is not None:
        box = Container(req.container_runtime, req.container_image, req.container_mounts,
                        req.container_options)
    elif req.container_mounts or req.container_options:
        raise UserError("--container-mount and --container-option need --container-image")
    written = write_job(ScriptOptions(
        run_dir=req.run_dir, nodes=req.nodes, duration_s=settings.run.duration_s,
        grace_s=settings.deadline_grace(),
        gpus_per_node=req.gpus_per_node, cpus_per_task=req.cpus_per_task, store_url=url,
        partition=req.partition, account=req.account, time_limit_s=limit, settings=settings,
        sbatch_extra=req.sbatch_extra, container=box, exclusive=req.exclusive,
        small_task=req.small_task))
    return written, settings
