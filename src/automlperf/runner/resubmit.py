"""An interrupted run's batch script submitted again (``automlperf slurm --resume``), alone
or as a chain of jobs (runner/chain.py): the time its next job must hold, with a start-up
allowance measured from the run's first job, and the options that override the script's own.
Nothing is written to the run here: an extension (``--duration``) is passed to the job,
whose primary makes it when its clock starts (a job cancelled before then leaves the run as
it was).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf.config import Config, parse_duration
from automlperf.runner.chain import ChainPlan, chain_limit, export_option, plan_chain
from automlperf.runner.extension import check_longer, run_time_done
from automlperf.runner.joblimits import (CHAIN_ENV, EXTEND_ENV, STAGE_ENV, STARTUP_S, link_lead,
                                         margins, measured_finish)
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


def resubmission_needs(run_dir: Path, extend_to: float | None = None,
                       stage_s: float | None = None) -> Needs:
    """What submitting a run's script again must give its job (:class:`Needs`), for a run
    extended to ``extend_to`` (seconds) where given. The start-up allowance is measured:
    twice what the run's first job took from its start to the clock, where the job's limit
    was recorded; else the script's own allowance. ``stage_s`` replaces the script's staging
    allowance (the job is given at least its start-up allowance and that)."""
    run_dir = run_dir.resolve()
    if not (run_dir / "automlperf.sbatch").exists():
        raise SlurmError(f"{run_dir} has no automlperf.sbatch: write one with `automlperf slurm`")
    text = (run_dir / "automlperf.sbatch").read_text()
    # The script's signal lead stays (its #SBATCH line, and what it tells the primary).
    signal = re.search(r"#SBATCH --signal=B:TERM@(\d+)", text)
    lead = float(signal.group(1)) if signal else float(margins(0)[1])
    staged = re.search(r"^# automlperf: staging allowance (\d+) s$", text, re.M)
    if stage_s is not None and staged is None:
        raise SlurmError(f"{run_dir}/automlperf.sbatch stages no data: --stage-time is for a "
                         "run written with --stage-to")
    allowance = re.search(r"^# automlperf: start-up allowance (\d+) s$", text, re.M)
    own = float(allowance.group(1)) if allowance else STARTUP_S
    startup = own + (stage_s if stage_s is not None else
                     float(staged.group(1)) if staged else 0.0)
    took = None
    duration = None
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
            if extend_to is not None:
                check_longer(duration, extend_to)
            left = max(0.0, (extend_to or duration) - run_time_done(store, run_id))
            took = _first_startup(run["system"], store.segments(run_id))
    if took is not None:
        startup = max(MIN_STARTUP_S, 2 * took, startup if stage_s is not None else 0.0)
    return Needs(startup, left, _grace(run_dir, extend_to), int(lead), took is not None)


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
    # What the job is told in its environment (an extension, a staging allowance): with a
    # chain, passed to every job by chain.submit_chain; else in ``options``.
    exports: dict[str, str] | None = None

    def line(self) -> str:
        """What is left of the run, and the time limit that holds it."""
        measured = (f" (start-up {self.needs.startup_s:.0f} s: twice the first job's)"
                    if self.needs.measured else "")
        return (f"{self.left_s:.0f} s of the run left: time limit "
                f"{format_time(self.time_limit_s)}{measured}")


# What a resubmission may change; every other option of ``automlperf slurm`` is the run's.
RESUME_MAY_CHANGE = ("--partition", "--account", "--time-limit", "--sbatch", "--stage-time")


def refuse_changes(given: dict[str, object]) -> None:
    """Every option is honoured or refused, none dropped without a word: ``given`` maps the
    options a resubmission cannot change to their values (None: not given)."""
    fixed = [name for name, value in given.items() if value is not None]
    if fixed:
        raise SlurmError(f"{', '.join(fixed)} cannot change on --resume: the run keeps what "
                         f"it was started with ({', '.join(RESUME_MAY_CHANGE[:-1])} and "
                         f"{RESUME_MAY_CHANGE[-1]} may change, and "
                         "--duration extends it); write a new script into a new --run-dir "
                         "for another run")


def resume_job(run_dir: Path, time_limit: str | None = None, partition: str | None = None,
               account: str | None = None, sbatch_extra: list[str] | None = None,
               duration: str | None = None, chain: bool = False,
               stage_time: str | None = None) -> Resubmission:
    """The run in ``run_dir`` submitted again. Its script keeps every option it was written
    with; those given here override them for this submission (sbatch's own options win over
    the script's #SBATCH lines): a partition, an account, a time limit that must still hold
    what the run needs, or any sbatch option (``--exclude=badnode``). ``duration`` extends
    the run to that longer length: sized here, made by the job as its clock starts
    (runner/extension.py). ``stage_time`` gives each node's staging that long. ``chain``
    plans a chain of jobs of the time limit (or the partition's maximum) for what is left,
    each given twice the start-up the run's first job took, and a lead of twice the longest
    stop the run measured (joblimits.link_lead)."""
    script = run_dir.resolve() / "automlperf.sbatch"
    if chain and script.exists() and CHAIN_ENV not in script.read_text():
        raise SlurmError(f"{script} was written by an automlperf that knew no chains: resubmit "
                         "it without --chain, with a --time-limit that holds what is left")
    extend_to = parse_duration(duration) if duration is not None else None
    if extend_to is not None and not (run_dir.resolve() / "run.json").exists():
        raise SlurmError(f"the run in {run_dir.resolve()} never started its clock, so there is "
                         "nothing to extend: resubmit it as it is, or write a new script with "
                         "--duration")
    stage_s = parse_duration(stage_time) if stage_time is not None else None
    if extend_to is not None and script.exists() and EXTEND_ENV not in script.read_text():
        raise SlurmError(f"{script} was written by an automlperf that extends runs before they "
                         "queue: write the run's script again, or extend it with `automlperf "
                         "run --resume --duration` where its store is served")
    needs = resubmission_needs(run_dir, extend_to, stage_s)
    needed, left = needs.limit_s, needs.left_s
    exports = {}
    if extend_to is not None:
        exports[EXTEND_ENV] = str(int(extend_to))
    if stage_s is not None:
        exports[STAGE_ENV] = str(int(stage_s))
    options = []
    if partition:
        options.append(f"--partition={partition}")
    if account:
        options.append(f"--account={account}")
    options += list(sbatch_extra or [])
    if chain:
        plan = plan_chain(left + needs.grace_s, chain_limit(time_limit, partition),
                          needs.startup_s, link_lead(measured_finish(run_dir.resolve())))
        return Resubmission(script, options, plan.limit_s, left, needs, plan, exports)
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
    return Resubmission(script, [f"--time={format_time(limit)}", *export_option(exports),
                                 *options], limit, left, needs, None, exports)


def _grace(run_dir: Path, extend_to: float | None = None) -> float:
    """The grace the run gives epochs in flight at its deadline: that of its own
    configuration once it started (of the extended run, for ``extend_to``), else the
    submitted one's."""
    for name in ("config.toml", "submitted-config.toml"):
        if (run_dir / name).exists():
            config = Config.load(run_dir / name)
            if extend_to is not None:
                config = config.model_copy(update={"run": config.run.model_copy(
                    update={"duration_s": extend_to})})
            return config.deadline_grace()
    return 0.0
