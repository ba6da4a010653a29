"""A run longer than a partition lets one job last, split into a chain of jobs
(``automlperf slurm --chain``): each job of the chain resumes the run where the last one's
time limit stopped it, and the job that ends the run cancels the ones still queued.

Each link is the run's own batch script (runner/sbatch.sh.j2), submitted with
``--dependency=afterany`` on the link before it and ``AUTOMLPERF_CHAIN_LINK`` in its
environment, which lets its primary start a clock the job cannot hold to the end
(runner/session.py): the job's signal then stops the run like ``scancel --batch
--signal=TERM``, with the result of the time run so far written, and the next link goes on.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from automlperf.config import parse_duration
from automlperf.runner.joblimits import (CHAIN_ENV, CHAIN_FILE, LINK_MARGIN_ENV, MIN_LINK_RUN_S,
                                         OVER_FILE)
from automlperf.runner.slurm import SlurmError, format_time, require
from automlperf.store.rundir import write_atomic


@dataclass(frozen=True)
class ChainPlan:
    """The jobs of a chain, each of ``limit_s``: the run each holds, and how many."""

    limit_s: float
    startup_s: float
    lead_s: int
    run_per_link_s: float
    links: int  # the jobs the run needs, and one to spare

    def describe(self) -> str:
        return (f"a chain of {self.links} jobs of {format_time(self.limit_s)} (each: start-up "
                f"{self.startup_s / 60:.0f} min, run {self.run_per_link_s / 60:.1f} min, result "
                f"{(self.lead_s + 60) / 60:.0f} min; one spare, cancelled if not needed)")

    @property
    def reserved_s(self) -> float:
        """What each job holds besides its run: the start-up, the lead and SLURM's minute."""
        return self.limit_s - self.run_per_link_s


def plan_chain(need_s: float, limit_s: float, startup_s: float, lead_s: int) -> ChainPlan:
    """The chain of jobs of ``limit_s`` that holds ``need_s`` of run (what is left of the
    run, and the grace for the epochs in flight at its deadline, which the last job holds):
    each job gives ``startup_s`` before its clock and ``lead_s`` and a minute after it. A
    spare job covers a start-up slower than planned and the epochs each stop cuts short."""
    limit_s = math.floor(limit_s / 60) * 60  # SLURM's limits are whole minutes
    per_link = limit_s - startup_s - lead_s - 60
    if per_link < MIN_LINK_RUN_S:
        raise SlurmError(f"a time limit of {format_time(limit_s)} leaves {max(0.0, per_link):.0f} s "
                         f"of run in each job of a chain, after a start-up of {startup_s:.0f} s "
                         f"and {lead_s + 60} s to write the result: give a --time-limit of at "
                         f"least {format_time(startup_s + lead_s + 60 + MIN_LINK_RUN_S)}")
    return ChainPlan(limit_s, startup_s, lead_s, per_link, math.ceil(need_s / per_link) + 1)


def slurm_duration(text: str) -> float | None:
    """A SLURM time (``[days-]hours:minutes:seconds``, ``minutes:seconds``, ``minutes``,
    ``days-hours``) as seconds; None for ``infinite``, ``UNLIMITED`` or anything else."""
    found = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if found is None:
        return None
    days, first, second, third = found.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # hours:minutes:seconds
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # minutes[:seconds]
        hours, minutes, seconds = 0, int(first), int(second or 0)
    return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)


def partition_max_time(partition: str | None) -> float:
    """The longest a job may run in ``partition`` (the default partition for None), from
    ``sinfo``; refused in one line where it sets no maximum."""
    done = subprocess.run([require("sinfo"), "-h", "-o", "%P %l"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmError(f"sinfo failed ({said}): give --time-limit, the partition's maximum "
                         "time, with --chain")
    rows = [line.split() for line in done.stdout.splitlines() if len(line.split()) == 2]
    for name, limit in rows:
        default = name.endswith("*")
        if (partition is None and default) or name.rstrip("*") == partition:
            seconds = slurm_duration(limit)
            if seconds is None:
                raise SlurmError(f"partition {name.rstrip('*')} sets no maximum time ({limit}): "
                                 "one job can hold the run, so leave out --chain (or give "
                                 "--time-limit, the longest job you want)")
            return seconds
    which = f"partition {partition}" if partition else "a default partition"
    raise SlurmError(f"sinfo shows no {which}: give --partition, or --time-limit with --chain")


def chain_limit(time_limit: str | None, partition: str | None) -> float:
    """The time limit of each job of a chain: ``time_limit``, else the partition's maximum."""
    return parse_duration(time_limit) if time_limit else partition_max_time(partition)


def export_option(exports: Mapping[str, str]) -> list[str]:
    """sbatch's ``--export`` that passes the submitting environment and ``exports`` (none
    without any): one option, since a second would replace the first."""
    if not exports:
        return []
    return ["--export=" + ",".join(["ALL", *(f"{k}={v}" for k, v in exports.items())])]


def link_options(plan: ChainPlan, exports: Mapping[str, str] | None = None) -> list[str]:
    """The sbatch options of every job of the chain: its time limit, its signal's lead (a
    script written for one job holds the lead of the whole run), and the environment that
    makes it a job of a chain."""
    return [f"--time={format_time(plan.limit_s)}", f"--signal=B:TERM@{plan.lead_s}",
            *export_option({CHAIN_ENV: "1", LINK_MARGIN_ENV: str(plan.lead_s + 60),
                            **(exports or {})})]


def submit_chain(script: Path, plan: ChainPlan, options: list[str],
                 sbatch: Callable[..., str], exports: Mapping[str, str] | None = None
                 ) -> list[str]:
    """Submit the chain's jobs, each after the last ends however it ends; their ids, also
    kept in the run directory's chain.jobs, each written before the next is submitted."""
    run_dir = script.parent
    (run_dir / OVER_FILE).unlink(missing_ok=True)
    jobs: list[str] = []
    for _ in range(plan.links):
        link = [*link_options(plan, exports), *options]
        if jobs:
            # Each after the last, however it ended. (A link cancelled while it waits meets
            # its successor's `afterany` at once: that successor then starts, and does
            # nothing once the run is over, or refuses at once while another job holds the
            # run's store, which the script claims before anything else.)
            link += [f"--dependency=afterany:{jobs[-1]}", "--kill-on-invalid-dep=yes"]
        try:
            jobs.append(sbatch(script, options=link))
        except SlurmError as exc:
            if not jobs:
                raise
            raise SlurmError(f"{exc}; the chain's first {len(jobs)} job(s) are queued "
                             f"({', '.join(jobs)}): `automlperf slurm --resume --chain "
                             f"--run-dir {run_dir}` once they end submits what is left") from None
        write_atomic(run_dir / CHAIN_FILE, "".join(f"{job}\n" for job in jobs))
    return jobs
