"""The steps of one session of the primary (runner/primary.py): prepare the run directory and
its store (a new run, or ``resume`` of an interrupted one), supervise the replicas until the
deadline, and finish: stop them, close the session and write result.json."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from automlperf import rules
from automlperf.config import Config
from automlperf.errors import NoClock
from automlperf.events import FailureKind
from automlperf.dataset.shared import SHARED_INDEX
from automlperf.measure import provenance
from automlperf.measure.result import build_result, write_result
from automlperf.report.console import LiveView
from automlperf.runner import dataproof
from automlperf.runner.extension import extend, run_time_done
from automlperf.runner.joblimits import CHAIN_FILE, MIN_LINK_RUN_S, OVER_FILE
from automlperf.runner.launch import Launcher, wait_all
from automlperf.runner.recovery import Recovered, recover
from automlperf.runner.trials import FIXES
from automlperf.store import ReplicaRecord, Store, TrialStatus, open_store, redact
from automlperf.store.feed import ReplicaFeed
from automlperf.store.opening import served
from automlperf.store.service.client import RemoteStore, service_file
from automlperf.store.service.process import ServiceProcess
from automlperf.store.rundir import RunDir, RunDirError, write_atomic
from automlperf.store.urls import strip_password

if TYPE_CHECKING:
    from automlperf.runner.slurm import JobLimit

PREPARED = {"automlperf.sbatch", "logs", "postgres", "submitted-config.toml", ".store-password",
            "container.json", SHARED_INDEX, "staging", CHAIN_FILE, OVER_FILE, "health",
            "job.json"}


@dataclass
class Session:
    dir: RunDir
    store: Store
    run_id: int
    config: Config
    segment: int
    started_at: float
    deadline_at: float
    elapsed_before: float
    startup: dict[str, Any] = field(default_factory=dict)  # what came before the clock
    # What the store took back from the trial logs when the run was resumed.
    recovered: Recovered = field(default_factory=Recovered)
    # The run's store service (a PostgreSQL store), which ``store`` reaches.
    service: ServiceProcess | None = None
    extended: bool = False  # this session made the run longer (runner/extension.py)
    # What the live view says besides the store's records: the job's end, the nodes that
    # staged the data (report/console.py LiveView).
    context: dict[str, Any] = field(default_factory=dict)
    # When the stop began (the deadline's epochs drained, or the signal): what the stop
    # takes is measured from here (joblimits.record_finish).
    stopping_since: float | None = None

    @property
    def path(self) -> Path:
        return self.dir.path

    def stop_service(self) -> None:
        """Stop the store service once everything is written (a second call does nothing)."""
        if self.service is not None:
            self.service.stop()
            self.service = None


def prepare(config: Config | None, run_dir: Path, store_url: str | None, resume: bool,
            system: dict[str, Any], limit: JobLimit | None = None,
            process_start: float | None = None, listen_all: bool = False,
            extend_to: float | None = None,
            proving: dataproof.Proving | None = None) -> Session:
    """Create the run (or reopen it to resume) and open a new session with its deadline;
    ``extend_to`` first makes a resumed run one of that longer duration (runner/extension.py).
    The data is read before the clock: a new run identifies it, and every session of a run
    that reads the official archives proves them again (runner/dataproof.py; ``proving``, the
    pass begun beside the start-up).
    ``limit`` is the batch job's time limit: a session that could not run its full time
    within it (less what the primary needs after the deadline) is refused before its clock
    starts. A run on a PostgreSQL server gets its store service, which replicas on other
    nodes reach with ``listen_all``."""
    rd = RunDir(run_dir)
    if not resume and run_dir.exists() and any(p.name not in PREPARED for p in run_dir.iterdir()):
        raise RunDirError(f"{run_dir} exists and is not empty: pass --resume to continue "
                          "that run, or choose another --run-dir")
    # Scanning the data comes before the clock starts: it is not the benchmark's work.
    scanned = time.time()
    origin = _origin_or_nothing(config, run_dir, proving) if config is not None and not resume else {}
    startup = {**system.get("startup", {}), **origin.pop("startup", {})}
    if config is not None and config.data.data_dir is not None and not resume:
        startup["dataset_s"] = round(time.time() - scanned, 3)
    now = time.time()
    if process_start is not None:
        startup["before_clock_s"] = round(now - process_start, 3)
    if limit is not None and config is not None and not resume:
        # The job must also hold the grace in which epochs in flight at the deadline finish.
        _check_fits(config.run.duration_s + config.deadline_grace(), now, limit, startup)
    if resume:
        meta = rd.meta()
        run_id = int(meta["run_id"])
        store = open_store(rd.store_url(store_url), run_dir=run_dir)
        config = Config.load(rd.config)
        try:
            startup.update(dataproof.reprove(config, rd, store, run_id, proving))
        except BaseException:
            store.close()
            raise
        if "data_proof_s" in startup:
            # The proof came before the clock: its time is the start-up's.
            now = time.time()
            if process_start is not None:
                startup["before_clock_s"] = round(now - process_start, 3)
        # What the logs kept and the store lost goes back first: the epochs, and the
        # outcome of a trial that ended while the store could not hear of it.
        recovered = recover(store, rd, run_id, config)
        # Trials that were running when the run stopped are over; their epochs stay.
        store.expire_leases(run_id, math.inf)
        segments = store.segments(run_id)
        for seg in segments:
            if seg.ended_at is None:
                store.end_segment(run_id, seg.index, min(seg.last_seen, seg.deadline_at))
        elapsed = run_time_done(store, run_id)
        # A duration the run already has was given it by an earlier job of this extension
        # (a chain's, a requeued one's): nothing more to do.
        extended = extend_to is not None and extend_to != config.run.duration_s
        if extended:
            try:
                config, _ = extend(store, rd, run_id, float(extend_to or 0), now)
            except BaseException:
                store.close()
                raise
    else:
        extended = False
        if config is None:
            raise ValueError("a new run needs a configuration")
        config.check_official()
        system = {**system, **origin, "startup": startup}
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(rd.config, config.to_toml())
        write_atomic(rd.system, json.dumps(system, indent=1) + "\n")
        store = open_store(store_url, run_dir=run_dir, create=True)
        run_id = store.create_run(run_dir.name, config.model_dump(mode="json"), system,
                                  config.run.duration_s, now)
        rd.write_meta(run_id, strip_password(store_url) if store_url else None, run_dir.name)
        elapsed = 0.0
        recovered = Recovered()
    remaining = max(0.0, config.run.duration_s - elapsed)
    if limit is not None and resume:
        try:
            ruleset = rules.get(store.run(run_id)["system"].get("ruleset"))
            _check_fits(remaining + config.deadline_grace(ruleset), now, limit, startup)
        except BaseException:
            store.close()
            raise
    segment = store.start_segment(run_id, now, now + remaining)
    url = rd.store_url(store_url)
    if not served(url):
        return Session(rd, store, run_id, config, segment, now, now + remaining, elapsed,
                       startup, recovered, extended=extended)
    # Replicas (and this primary's session) reach the database through the run's store
    # service; the finished run's records in bulk are read directly.
    service = ServiceProcess(run_dir, store.url, listen_all, config.run.replicas)
    service.start()
    try:
        remote = RemoteStore(service_file(run_dir), direct=store,
                             primary_token=service.primary_token)
    except BaseException:
        service.stop()
        raise
    return Session(rd, remote, run_id, config, segment, now, now + remaining, elapsed, startup,
                   recovered, service, extended=extended)


def _origin_or_nothing(config: Config, run_dir: Path,
                       proving: dataproof.Proving | None = None) -> dict[str, Any]:
    """:func:`record_origin` for a new run; a run refused there (or stopped during the scan)
    leaves the run directory as it found it, so the same command with ``--unofficial`` or
    other data starts in it: the index it saved, and the directory if it made it, go."""
    existed, index = run_dir.exists(), run_dir / SHARED_INDEX
    had_index = index.exists()
    try:
        return record_origin(config, run_dir=run_dir, proving=proving)
    except BaseException:
        if not had_index:
            shutil.rmtree(index, ignore_errors=True)
        if not existed and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise


def _check_fits(remaining: float, now: float, limit: JobLimit, startup: dict[str, Any]) -> None:
    """Refuse to start a clock that the batch job's time limit would cut short; a job of a
    chain starts one it holds a minute of, and the next job goes on from where it stops."""
    if now + remaining <= limit.must_end_by:
        return
    if limit.chain_link and limit.must_end_by - now >= MIN_LINK_RUN_S:
        return
    took = startup.get("before_clock_s")
    raise NoClock(f"the job's time limit leaves {max(0.0, limit.must_end_by - now):.0f} s "
                     f"for a session that needs {remaining:.0f} s"
                     + (f" (the primary's start-up took {took:.0f} s)" if took is not None else "")
                     + f"; the clock was not started: {limit.advice(remaining, now)}")


def record_origin(config: Config, ruleset: rules.Ruleset = rules.CURRENT,
                  run_dir: Path | None = None, proving: dataproof.Proving | None = None,
                  proof: bool = True) -> dict[str, Any]:
    """What a new run records beside the system description: the ruleset it is judged by,
    its provenance, and the identity of its data (runner/dataproof.py: the archives proven,
    or a folder walked once; with ``run_dir``, the index is saved there for the replicas).
    A run that aims to be official (:meth:`Config.strict`) on data that is not the
    ruleset's dataset is refused before anything is written; with ``proof`` off, archives
    are only seen to be there (a job's submission: its sessions prove them)."""
    config.check_official()
    identity, index_note = dataproof.identify(config, ruleset, run_dir, proving, proof)
    origin = {"ruleset": ruleset.id, "provenance": provenance.collect(),
              "dataset_identity": identity, "seed": config.new_seed()}
    if index_note:
        origin["startup"] = index_note
    return origin


def replica_states(launcher: Launcher) -> list[str]:
    """What the live view shows per replica: the launcher's own words where it has them."""
    states = getattr(launcher, "states", None)
    if states is not None:
        return list(states())
    return ["up" if alive else "exited" for alive in launcher.alive()]


@dataclass
class Watch:
    """How supervision ended: ``completed`` (the deadline, or every replica done),
    ``interrupted`` (Ctrl-C, SIGTERM) or ``failed`` (the run cannot train; ``reason``)."""

    state: str
    reason: str = ""

    @property
    def completed(self) -> bool:
        return self.state == "completed"


def gave_up(store: Store, run_id: int, segment: int,
            replicas: list[ReplicaRecord] | None = None) -> list[Any]:
    """The replicas of this session that stopped themselves, recording why they cannot
    train (their trainer could not start on their node, the data is not there, trials keep
    failing alike). ``replicas``: the run's replicas as last seen, else read from the
    store."""
    return [rep for rep in (store.replicas(run_id) if replicas is None else replicas)
            if rep.segment == segment and rep.status == TrialStatus.FAILED and rep.reason]


def failure(store: Store, run_id: int, segment: int, exit_codes: list[int | None],
            log_dir: Path, left: bool = False,
            replicas: list[ReplicaRecord] | None = None,
            causes: list[str | None] | None = None) -> str | None:
    """Why the run cannot go on, if it cannot: no replica is ``left`` to train and those that
    gave up said why, or every replica exited with an error without saying why (it could
    not even start). One replica that gives up on a sick node is retired, not the run's end:
    the run ends only when the failure hits every replica. ``replicas``: the run's replicas
    as last seen, else read from the store; ``causes``: why each replica ended, where more
    is known than its exit code (the kernel's out-of-memory killer)."""
    if left:
        return None
    if replicas is None:
        replicas = store.replicas(run_id)
    given_up = gave_up(store, run_id, segment, replicas)
    finished = any(rep.status == TrialStatus.STOPPED for rep in replicas
                   if rep.segment == segment)
    if given_up and not finished:
        rep = given_up[0]
        return f"replica {rep.index} ({rep.host}): {rep.reason}"
    if exit_codes and all(code is not None and code != 0 for code in exit_codes):
        causes = causes or [None] * len(exit_codes)
        codes = ", ".join(f"replica {i}: {code}" + (f", {cause}" if cause else "")
                          for i, (code, cause) in enumerate(zip(exit_codes, causes)))
        fix = f"; {FIXES[FailureKind.OOM]}" if any(causes) else ""
        return (f"every replica exited with an error before the deadline ({codes}){fix}; "
                f"see {log_dir}/replica-*.log")
    return None


def retirement(rep: Any) -> str:
    """The one line that says which replica stopped on which node, and why."""
    return f"replica {rep.index} on {rep.host} retired: {rep.reason}"


def gone(launcher: Launcher, states: list[str], announced: set[int], lease_s: float) -> list[str]:
    """One timed line for each replica newly seen gone without a word while the run goes on:
    silent past its lease, its node lost, or ended by a signal or an error (a replica that
    retires says why itself, and one that ends at the deadline is no news)."""
    lines = []
    procs = list(launcher.procs)
    for index, state in enumerate(states):
        if index in announced or state in ("up", "waiting"):
            continue
        code = procs[index].poll() if index < len(procs) else None
        if state == "lost":
            why = f"silent past its lease ({lease_s:.0f} s): lost"
        elif state == "node lost":
            why = "its node was lost"
        elif code is not None and -64 < code < 0:
            why = f"killed by signal {-code}"
        elif code:
            why = f"ended with status {code}"
        else:
            continue
        announced.add(index)
        lines.append(f"{time.strftime('%H:%M:%S')} replica {index}: {why}; its trial in "
                     "flight fails when its lease lapses, and the run goes on")
    return lines


def leases_judged(store: Store, now: float, lease_s: float) -> bool:
    """Whether lapsed leases at ``now`` mean silent replicas: not until a full lease has
    passed since the store came back from an outage, which kept live replicas from
    heart-beating as much as dead ones."""
    return now - store.silent_since(0.0) >= lease_s


def supervise(session: Session, launcher: Launcher, console: Console) -> Watch:
    """Watch the replicas until the deadline, until every replica is done, or until the run
    turns out unable to train."""
    s = session
    run = s.store.run(s.run_id)
    view = LiveView(s, context=s.context, blockers=blockers(s.config, run),
                    max_error=rules.get(run["system"].get("ruleset")).max_error)
    changed = ReplicaFeed(s.store, s.run_id)
    seen: dict[int, ReplicaRecord] = {}
    tick = 1.0
    last_line = 0.0
    retired: set[int] = set()
    announced: set[int] = set()
    live = Live(console=console, refresh_per_second=2, transient=False,
                auto_refresh=False) if console.is_terminal else None
    try:
        if live:
            live.start()
        while True:
            now = time.time()
            s.store.touch_segment(s.run_id, s.segment, now)
            if leases_judged(s.store, now, s.config.run.lease_timeout_s):
                s.store.expire_leases(s.run_id, now)
            states = replica_states(launcher)
            if live:
                live.update(view.view(now, states), refresh=True)
            elif now - last_line > 30:
                console.print(view.line(now, states), highlight=False)
                last_line = now
            left = any(x in ("up", "waiting") for x in states)
            for line in gone(launcher, states, announced, s.config.run.lease_timeout_s):
                console.print(line, highlight=False, soft_wrap=True)
            # The replicas registered or ended since the last look: a tick reads those, not
            # every replica's row.
            seen.update((rep.id, rep) for rep in changed.read())
            for rep in gave_up(s.store, s.run_id, s.segment, list(seen.values())):
                if rep.id not in retired and left:
                    retired.add(rep.id)
                    console.print(retirement(rep), highlight=False, soft_wrap=True)
            causes = getattr(launcher, "causes", None)
            broken = failure(s.store, s.run_id, s.segment, [p.poll() for p in launcher.procs],
                             s.dir.logs, left, list(seen.values()),
                             causes() if causes is not None and not left else None)
            if broken is not None:
                return Watch("failed", broken)
            if now >= s.deadline_at or not left:
                return Watch("completed")
            time.sleep(min(tick, max(0.05, s.deadline_at - now)))
    except KeyboardInterrupt:
        return Watch("interrupted")
    finally:
        if live:
            live.stop()


def blockers(config: Config, run: dict[str, Any]) -> list[str]:
    """What keeps the run's result from being valid whatever it reaches (its accuracy
    aside): simulated accelerators, a changed fixed setting, data that is not the ruleset's,
    a duration under its minimum. The live view's "valid so far" is these and the error."""
    ruleset = rules.get(run["system"].get("ruleset"))
    found = []
    if config.simulated:
        found.append("simulated")
    identity = run["system"].get("dataset_identity") or {}
    if config.data.dataset != ruleset.dataset.name or identity.get("problems"):
        found.append(f"not {ruleset.dataset.name}")
    if any(not change.startswith("data.dataset ") for change in config.fixed_changes(ruleset)):
        found.append("fixed settings changed")
    if config.run.duration_s < ruleset.min_duration_s:
        found.append(f"under {ruleset.min_duration_s / 3600:g} h")
    return found


def replicas_working(store: Store, run_id: int, segment: int, now: float, lease_s: float) -> int:
    """Replicas of the session still at work: recorded as running, and heard from within a
    lease (one that died without a word is not waited for)."""
    return sum(1 for rep in store.replicas(run_id) if rep.segment == segment
               and rep.status == TrialStatus.RUNNING and now - rep.last_heartbeat < lease_s)


def drain(session: Session, console: Console, clock: Any = time.time,
          sleep: Any = time.sleep) -> None:
    """After the deadline, while the replicas finish their epochs in flight (inside the
    run's grace) and stop: keep the session alive for them, until none is at work or the
    grace and the stop's own allowance are over. Ctrl-C ends the wait."""
    s = session
    ruleset = rules.get(s.store.run(s.run_id)["system"].get("ruleset"))
    grace = s.config.deadline_grace(ruleset)
    until = s.deadline_at + grace + s.config.run.stop_grace_s
    told = False
    try:
        while True:
            now = clock()
            s.store.touch_segment(s.run_id, s.segment, now)
            working = replicas_working(s.store, s.run_id, s.segment, now,
                                       s.config.run.lease_timeout_s)
            if not working or now >= until:
                return
            if grace and not told:
                console.print(f"deadline reached: {working} replica(s) finishing the epoch in "
                              f"flight (grace {grace:.0f} s)", highlight=False)
                told = True
            sleep(min(1.0, max(0.0, until - now)))
    except KeyboardInterrupt:
        return


def finish(session: Session, launcher: Launcher, console: Console, watch: Watch,
           system: dict[str, Any]) -> dict[str, Any]:
    """Stop the replicas, close the session and write result.json."""
    s = session
    s.store.touch_segment(s.run_id, s.segment, time.time())
    if watch.completed:
        # At the deadline replicas stop by themselves (after the epoch in flight, inside
        # the grace), recording cut-short trials as stopped.
        drain(s, console)
        s.stopping_since = time.time()
        wait_all(launcher.procs, s.config.run.stop_grace_s)
    else:
        s.stopping_since = time.time()
    launcher.stop(s.config.run.stop_grace_s)
    end = min(time.time(), s.deadline_at)
    for line in dataproof.recheck(s.store, s.dir, s.run_id, s.config):
        console.print(line, highlight=False, soft_wrap=True)
    s.store.end_segment(s.run_id, s.segment, end)
    # A replica killed between its log and the store, or cut off by the store, left its log
    # ahead: the store takes what the logs kept before anything is counted.
    recovered = recover(s.store, s.dir, s.run_id, s.config)
    if recovered:
        console.print(recovered.describe(), highlight=False)
    # Anything a killed replica left running is over; its completed epochs count.
    s.store.expire_leases(s.run_id, math.inf)
    result = build_result(s.store, s.run_id, s.config, system,
                          interrupted=watch.state == "interrupted")
    write_result(s.dir.result, result)
    return result


def redacted(url: str | None) -> str:
    return redact(url) if url else "history.db"
