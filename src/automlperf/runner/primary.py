"""The primary: set up the run, start the clock, launch replicas, watch, stop at the
deadline, score. ``resume`` continues an interrupted run directory."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from automlperf import rules
from automlperf.config import Config, ConfigError
from automlperf.measure import provenance
from automlperf.dataset_identity import DatasetIdentityError, identify
from automlperf.measure.result import build_result, write_result
from automlperf.measure.score import run_time, segment_bounds
from automlperf.measure.units import format_ops
from automlperf.runner.launch import Launcher, wait_all
from automlperf.search.hpo import prepare_storage
from automlperf.store.rundir import RunDir, RunDirError, write_atomic
from automlperf.store import Store, TrialStatus, TrialTally, open_store, redact
from automlperf.store.feed import EpochFeed
from automlperf.store.urls import strip_password


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# What `automlperf slurm` puts in a run directory before its run starts.
PREPARED = {"automlperf.sbatch", "logs", "postgres", "submitted-config.toml", ".store-password",
            "container.json"}


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


def prepare(config: Config | None, run_dir: Path, store_url: str | None, resume: bool,
            system: dict[str, Any]) -> Session:
    """Create the run (or reopen it to resume) and open a new session with its deadline."""
    rd = RunDir(run_dir)
    # Scanning the data comes before the clock starts: it is not the benchmark's work.
    origin = record_origin(config) if config is not None and not resume else {}
    now = time.time()
    if resume:
        meta = rd.meta()
        run_id = int(meta["run_id"])
        store = open_store(rd.store_url(store_url), run_dir=run_dir)
        config = Config.load(rd.config)
        # Trials that were running when the run stopped are over; their epochs stay.
        store.expire_leases(run_id, math.inf)
        segments = store.segments(run_id)
        for seg in segments:
            if seg.ended_at is None:
                store.end_segment(run_id, seg.index, min(seg.last_seen, seg.deadline_at))
        elapsed = sum(min(s.end, s.deadline_at) - s.started_at for s in store.segments(run_id))
    else:
        if config is None:
            raise ValueError("a new run needs a configuration")
        config.check_official()
        if run_dir.exists() and any(p.name not in PREPARED for p in run_dir.iterdir()):
            raise RunDirError(f"{run_dir} exists and is not empty: pass --resume to continue "
                              "that run, or choose another --run-dir")
        system = {**system, **origin}
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(rd.config, config.to_toml())
        write_atomic(rd.system, json.dumps(system, indent=1) + "\n")
        store = open_store(store_url, run_dir=run_dir, create=True)
        run_id = store.create_run(run_dir.name, config.model_dump(mode="json"), system,
                                  config.run.duration_s, now)
        rd.write_meta(run_id, strip_password(store_url) if store_url else None, run_dir.name)
        elapsed = 0.0
    prepare_storage(store.url)
    remaining = max(0.0, config.run.duration_s - elapsed)
    segment = store.start_segment(run_id, now, now + remaining)
    return Session(rd, store, run_id, config, segment, now, now + remaining, elapsed)


def record_origin(config: Config, ruleset: rules.Ruleset = rules.CURRENT) -> dict[str, Any]:
    """What a new run records beside the system description: the ruleset it is judged by,
    its provenance, and the identity of its data (scanned once, here). An official run on
    data that is not the ruleset's dataset is refused before anything is written."""
    config.check_official()
    identity = None
    if config.data.dataset == ruleset.dataset.name and config.data.data_dir is not None:
        try:
            identity = identify(config.data.data_dir, ruleset.dataset)
        except DatasetIdentityError as exc:
            if config.run.official:
                raise ConfigError(f"official run refused: {exc}") from None
            # An unofficial run goes on; its replicas say why they cannot read the data.
            identity = {"layout": None, "classes": 0, "train_images": 0, "val_images": 0,
                        "files": 0, "fingerprint": None, "problems": [str(exc)]}
        if config.run.official and identity["problems"]:
            raise ConfigError(f"official run refused: {config.data.data_dir} is not "
                              f"{ruleset.dataset.name} as ruleset {ruleset.id} defines it: "
                              + "; ".join(identity["problems"]))
    return {"ruleset": ruleset.id, "provenance": provenance.collect(),
            "dataset_identity": identity}


# Beyond this many replicas the live view shows one row per process state, not per replica:
# rendering 512 rows every second would cost the primary most of a core.
VIEW_ROWS = 32


def _count(tally: dict[tuple[int, str], TrialTally], status: str,
           replica: int | None = None) -> int:
    """Trials of ``status``: of one replica, or of all of them."""
    if replica is not None:
        found = tally.get((replica, status))
        return found.count if found else 0
    return sum(t.count for (_, st), t in tally.items() if st == status)


class LiveView:
    """What the primary's live view of the run shows, read from the store every second:
    the epochs recorded since the last read (kept as running totals) and a few rows of
    trial counts, so that a poll costs the same after ten hours as after ten seconds."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.feed = EpochFeed(session.store, session.run_id)
        # The current session is counted up to its deadline: it ends there at the latest.
        self.bounds = segment_bounds([replace(seg, last_seen=seg.deadline_at)
                                      if seg.ended_at is None else seg
                                      for seg in session.store.segments(session.run_id)])
        self.ops = 0
        self.last = 0.0  # run time of the last counted epoch's end
        self.best: float | None = None
        self.epochs = 0
        self.done_epochs: dict[int, int] = {}
        self.best_of_replica: dict[int, float] = {}

    def update(self) -> None:
        """Take in the epochs recorded since the last call."""
        for replica, e in self.feed.read():
            self.epochs += 1
            self.done_epochs[e.trial_id] = self.done_epochs.get(e.trial_id, 0) + 1
            self.best_of_replica[replica] = max(self.best_of_replica.get(replica, 0.0),
                                                e.val_accuracy)
            t = run_time(e.ended_at, self.bounds)
            if t is None:
                continue
            self.ops += e.ops
            self.last = max(self.last, t)
            self.best = e.val_accuracy if self.best is None else max(self.best, e.val_accuracy)

    def view(self, now: float, states: list[str]) -> Group:
        s = self.s
        self.update()
        tally: dict[tuple[int, str], TrialTally] = {(t.replica_index, t.status): t
                                                    for t in s.store.tally(s.run_id)}

        def count(status: str, replica: int | None = None) -> int:
            return _count(tally, status, replica)

        elapsed = s.elapsed_before + now - s.started_at
        remaining = max(0.0, s.deadline_at - now)
        head = Text.assemble(
            ("automlperf ", "bold"), f"{s.dir.path}  ",
            ("elapsed ", "dim"), fmt_duration(elapsed), ("  remaining ", "dim"),
            fmt_duration(remaining), ("  best accuracy ", "dim"),
            f"{self.best:.4f}" if self.best is not None else "-", ("  OPS ", "dim"),
            format_ops(self.ops / self.last if self.last else None), ("  trials ", "dim"),
            f"{count(TrialStatus.COMPLETED)} done, {count(TrialStatus.RUNNING)} running")
        if len(states) > VIEW_ROWS:
            return Group(head, self._by_state(states, tally))
        table = Table(show_edge=False, pad_edge=False)
        for col in ("replica", "process", "done", "failed", "running trial", "epochs", "best"):
            table.add_column(col)
        for index, state in enumerate(states):
            running = tally.get((index, TrialStatus.RUNNING))
            best = self.best_of_replica.get(index)
            table.add_row(str(index), state, str(count(TrialStatus.COMPLETED, index)),
                          str(count(TrialStatus.FAILED, index)),
                          str(running.last_id) if running else "-",
                          str(self.done_epochs.get(running.last_id, 0)) if running else "-",
                          f"{best:.4f}" if best is not None else "-")
        return Group(head, table)

    def _by_state(self, states: list[str], tally: dict[tuple[int, str], TrialTally]) -> Table:
        """Many replicas: one row per process state, its replicas' trials summed."""
        table = Table(show_edge=False, pad_edge=False)
        for col in ("process", "replicas", "done", "failed", "running", "best"):
            table.add_column(col)
        groups: dict[str, list[int]] = {}
        for index, state in enumerate(states):
            groups.setdefault(state, []).append(index)
        for state, members in groups.items():
            best = max((self.best_of_replica[i] for i in members if i in self.best_of_replica),
                       default=None)
            table.add_row(state, str(len(members)),
                          *(str(sum(_count(tally, status, i) for i in members))
                            for status in (TrialStatus.COMPLETED, TrialStatus.FAILED,
                                           TrialStatus.RUNNING)),
                          f"{best:.4f}" if best is not None else "-")
        return table

    def line(self, now: float, states: list[str]) -> str:
        s = self.s
        self.update()
        best = max(self.best_of_replica.values(), default=None)
        counts = ", ".join(f"{states.count(k)} {k}" for k in dict.fromkeys(states))
        return (f"elapsed {fmt_duration(s.elapsed_before + now - s.started_at)}, remaining "
                f"{fmt_duration(s.deadline_at - now)}, replicas {counts or 'none'}, "
                f"{self.epochs} epochs, best accuracy {best if best is None else round(best, 4)}")


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


def failure(store: Store, run_id: int, segment: int, exit_codes: list[int | None],
            log_dir: Path) -> str | None:
    """Why the run cannot go on, if it cannot: a replica gave up and recorded why, or every
    replica exited with an error without saying why (it could not even start)."""
    for rep in store.replicas(run_id):
        if rep.segment == segment and rep.status == TrialStatus.FAILED and rep.reason:
            return f"replica {rep.index} ({rep.host}): {rep.reason}"
    if exit_codes and all(code is not None and code != 0 for code in exit_codes):
        codes = ", ".join(f"replica {i}: {code}" for i, code in enumerate(exit_codes))
        return (f"every replica exited with an error before the deadline ({codes}); see "
                f"{log_dir}/replica-*.log")
    return None


def leases_judged(store: Store, now: float, lease_s: float) -> bool:
    """Whether lapsed leases at ``now`` mean silent replicas: not until a full lease has
    passed since the store came back from an outage, which kept live replicas from
    heart-beating as much as dead ones."""
    return now - store.silent_since(0.0) >= lease_s


def supervise(session: Session, launcher: Launcher, console: Console) -> Watch:
    """Watch the replicas until the deadline, until every replica is done, or until the run
    turns out unable to train."""
    s = session
    view = LiveView(s)
    tick = 1.0
    last_line = 0.0
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
            broken = failure(s.store, s.run_id, s.segment, [p.poll() for p in launcher.procs],
                             s.dir.logs)
            if broken is not None:
                return Watch("failed", broken)
            if now >= s.deadline_at or not any(x in ("up", "waiting") for x in states):
                return Watch("completed")
            time.sleep(min(tick, max(0.05, s.deadline_at - now)))
    except KeyboardInterrupt:
        return Watch("interrupted")
    finally:
        if live:
            live.stop()


def finish(session: Session, launcher: Launcher, console: Console, watch: Watch,
           system: dict[str, Any]) -> dict[str, Any]:
    """Stop the replicas, close the session and write result.json."""
    s = session
    s.store.touch_segment(s.run_id, s.segment, time.time())
    if watch.completed:
        # At the deadline replicas stop by themselves, recording cut-short trials as stopped.
        wait_all(launcher.procs, s.config.run.stop_grace_s)
    launcher.stop(s.config.run.stop_grace_s)
    end = min(time.time(), s.deadline_at)
    s.store.end_segment(s.run_id, s.segment, end)
    # Anything a killed replica left running is over; its completed epochs count.
    s.store.expire_leases(s.run_id, math.inf)
    result = build_result(s.store, s.run_id, s.config, system,
                          interrupted=watch.state == "interrupted")
    write_result(s.dir.result, result)
    return result


def summary(result: dict[str, Any], run_dir: Path) -> Table:
    table = Table(title=f"automlperf result: {run_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    label = "valid" if result["valid"] else "not valid"
    if not result["official"]:
        label += ", unofficial"
    if result.get("simulated"):
        label += ", SIMULATED (not a measurement)"
    rows = [("score", f"{format_ops(result['score'])} ({result['score']:.4e} OPS)"),
            ("regulated score", format_ops(result["regulated_score"])),
            ("best accuracy", "-" if result["best_accuracy"] is None
             else f"{result['best_accuracy']:.4f} (trial {result['best_trial']})"),
            ("operations", f"{result['total_ops']:.4e} in {result['elapsed_s']:.0f} s"),
            ("trials", f"{result['trials']} {result['trial_status']}"),
            ("result", label)]
    for v in result["violations"]:
        rows.append(("", escape(f"{v['rule']}: {v['detail']}")))
    for k, v in rows:
        table.add_row(k, v)
    return table


def redacted(url: str | None) -> str:
    return redact(url) if url else "history.db"
