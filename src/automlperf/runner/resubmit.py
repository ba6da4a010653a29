"""An interrupted run's batch script submitted again (``automlperf slurm --resume``), alone
or as a chain of jobs (runner/chain.py): the time its next job must hold, with a start-up
allowance measured from the run's first job, and the options that override the script's own.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf.config import Config, parse_duration
from automlperf.runner.chain import ChainPlan, chain_limit, plan_chain
from automlperf.runner.extension import extend, run_time_done
from automlperf.runner.joblimits import CHAIN_ENV, STARTUP_S, margins
from automlperf.runner.sbatch import MIN_STARTUP_S
from automlperf.runner.slurm import SlurmError, format_time
from automlperf.store.opening import run_store
from automlperf.store.rundir import RunDir


@dataclass(frozen=True)
class Needs:
    """What an interrupted run's next job must hold: its start-up before the clock (staging
    included), what is left of the run, the grace for the epochs in flight at its deadline,
    and the signal's lead (the minute after it aside)."""

    startup_s: float
    left_s: float
    grace_s: float
    lead_s: int
    measured: bool  # the start-up allowance is twice what the run's first job took

    @property
    def limit_s(self) -> float:
        return self.startup_s + self.left_s + self.grace_s + self.lead_s + 60


def resubmission_needs(run_dir: Path) -> Needs:
    """What submitting a run's script again must give its job (:class:`Needs`). The start-up
    allowance is measured: twice what the run's first job took from its start to the clock,
    where the job's limit was recorded; else the script's own allowance."""
    run_dir = run_dir.resolve()
    if not (run_dir / "automlperf.sbatch").exists():
        raise SlurmError(f"{run_dir} has no automlperf.sbatch: write one with `automlperf slurm`")
    text = (run_dir / "automlperf.sbatch").read_text()
    # The script's signal lead stays (its #SBATCH line, and what it tells the primary).
    signal = re.search(r"#SBATCH --signal=B:TERM@(\d+)", text)
    lead = float(signal.group(1)) if signal else float(margins(0)[1])
    staged = re.search(r"^# automlperf: staging allowance (\d+) s$", text, re.M)
    allowance = re.search(r"^# automlperf: start-up allowance (\d+) s$", text, re.M)
    startup = ((float(allowance.group(1)) if allowance else STARTUP_S)
               + (float(staged.group(1)) if staged else 0.0))
    took = None
    if not (run_dir / "run.json").exists():
        # The job never started the run's clock: it needs the whole duration.
        found = re.search(r"--duration (\d+)s", text)
        if found is None:
            raise SlurmError(f"{run_dir}/automlperf.sbatch names no --duration")
        left = float(found.group(1))
    else:
        rd = RunDir(run_dir)
        run_id = int(rd.meta()["run_id"])
        with run_store(run_dir) as store:
            run = store.run(run_id)
            duration = float(run["duration_s"])
            left = max(0.0, duration - run_time_done(store, run_id))
            took = _first_startup(run["system"], store.segments(run_id))
    if took is not None:
        startup = max(MIN_STARTUP_S, 2 * took)
    return Needs(startup, left, _grace(run_dir), int(lead), took is not None)


def _first_startup(system: dict[str, Any], segments: list[Any]) -> float | None:
    """What the run's first job took from its start (as its scheduler recorded it) to the
    run's clock: the store, the staging, the primary's start-up."""
    limit = system.get("job_limit") or {}
    started = limit.get("started_at")
    if not isinstance(started, (int, float)) or not segments:
        return None
    took = segments[0].started_at - float(started)
    return took if 0 <= took < 86400 else None


@dataclass
class Resubmission:
    """An interrupted run's script, submitted again: the sbatch options that override its
    own #SBATCH lines, and what sized its time limit."""

    script: Path
    options: list[str]
    time_limit_s: float
    left_s: float
    needs: Needs
    chain: ChainPlan | None = None  # with --chain: the jobs to submit (chain.submit_chain)


def resume_job(run_dir: Path, time_limit: str | None = None, partition: str | None = None,
               account: str | None = None, sbatch_extra: list[str] | None = None,
               duration: str | None = None, chain: bool = False) -> Resubmission:
    """The run in ``run_dir`` submitted again. Its script keeps every option it was written
    with; those given here override them for this submission (sbatch's own options win over
    the script's #SBATCH lines): a partition, an account, a time limit that must still hold
    what the run needs, or any sbatch option (``--exclude=badnode``). ``duration`` first
    extends the run to that longer length (runner/extension.py), here, before it queues.
    ``chain`` plans a chain of jobs of the time limit (or the partition's maximum) for what
    is left, each given twice the start-up the run's first job took."""
    script = run_dir.resolve() / "automlperf.sbatch"
    if chain and script.exists() and CHAIN_ENV not in script.read_text():
        raise SlurmError(f"{script} was written by an automlperf that knew no chains: resubmit "
                         "it without --chain, with a --time-limit that holds what is left")
    if duration is not None:
        _extend(run_dir.resolve(), parse_duration(duration))
    needs = resubmission_needs(run_dir)
    needed, left = needs.limit_s, needs.left_s
    options = []
    if partition:
        options.append(f"--partition={partition}")
    if account:
        options.append(f"--account={account}")
    options += list(sbatch_extra or [])
    if chain:
        plan = plan_chain(left + needs.grace_s, chain_limit(time_limit, partition),
                          needs.startup_s, needs.lead_s)
        return Resubmission(script, options, plan.limit_s, left, needs, plan)
    limit = needed
    if time_limit is not None:
        limit = parse_duration(time_limit)
        least = needed - needs.startup_s + MIN_STARTUP_S  # as for a new job's --time-limit
        if limit < least:
            raise SlurmError(f"--time-limit {format_time(limit)} cannot start the clock of "
                             f"what is left of the run ({left:.0f} s, with a start-up of "
                             f"{MIN_STARTUP_S:.0f} s, its grace and result): give at least "
                             f"{format_time(least)}, pass --chain to split it into jobs of "
                             f"this limit, or leave it out ({format_time(needed)})")
    return Resubmission(script, [f"--time={format_time(limit)}", *options], limit, left, needs)


def _extend(run_dir: Path, duration_s: float) -> None:
    if not (run_dir / "run.json").exists():
        raise SlurmError(f"the run in {run_dir} never started its clock, so there is nothing to "
                         "extend: resubmit it as it is, or write a new script with --duration")
    rd = RunDir(run_dir)
    with run_store(run_dir) as store:
        extend(store, rd, int(rd.meta()["run_id"]), duration_s, time.time())


def _grace(run_dir: Path) -> float:
    """The grace the run gives epochs in flight at its deadline: that of its own
    configuration once it started (an extension changes it), else the submitted one's."""
    for name in ("config.toml", "submitted-config.toml"):
        if (run_dir / name).exists():
            return Config.load(run_dir / name).deadline_grace()
    return 0.0
