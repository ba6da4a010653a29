"""The run on the terminal: the primary's live view, read from the store every second, and
the summary table of a result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from rich.console import Group
from rich.table import Table
from rich.text import Text

from automlperf.measure.score import run_time, segment_bounds
from automlperf.measure.units import format_ops
from automlperf.store import Store, TrialStatus, TrialTally
from automlperf.store.feed import EpochFeed, TrialFeed


class Watched(Protocol):
    """What the live view reads of the primary's session."""

    store: Store
    run_id: int
    started_at: float
    deadline_at: float
    elapsed_before: float

    @property
    def path(self) -> Path: ...


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# What `automlperf slurm` puts in a run directory before its run starts.
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
    the epochs recorded and the trials changed since the last read (kept as running totals
    and counts), so that a poll costs the same after ten hours as after ten seconds."""

    def __init__(self, session: Watched, context: dict[str, Any] | None = None,
                 blockers: list[str] | None = None, max_error: float = 0.30) -> None:
        self.s = session
        # The job's end and the nodes that staged the data (runner/primary.py), and what
        # keeps the result from being valid whatever its accuracy (runner/session.py).
        self.context = context or {}
        self.blockers = blockers or []
        self.max_error = max_error
        self.feed = EpochFeed(session.store, session.run_id)
        self.trial_feed = TrialFeed(session.store, session.run_id)
        self.tally: dict[tuple[int, str], TrialTally] = {}
        self._trials: dict[int, tuple[int, str]] = {}  # id -> (replica, status)
        self._running: dict[int, set[int]] = {}  # replica -> its running trials
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

    def count_trials(self) -> dict[tuple[int, str], TrialTally]:
        """Take in the trials claimed or ended since the last call; the counts by replica
        and status (a running count's ``last_id``: the replica's newest running trial)."""
        for c in self.trial_feed.read():
            before = self._trials.get(c.id)
            if before is not None:
                old = self.tally[before]
                old.count -= 1
                if before[1] == TrialStatus.RUNNING:
                    self._running[before[0]].discard(c.id)
                    old.last_id = max(self._running[before[0]], default=0)
            key = (c.replica_index, c.status)
            self._trials[c.id] = key
            found = self.tally.setdefault(key, TrialTally(replica_index=c.replica_index, status=c.status,
                                                         count=0, last_id=0))
            found.count += 1
            found.last_id = max(found.last_id, c.id)
            if c.status == TrialStatus.RUNNING:
                self._running.setdefault(c.replica_index, set()).add(c.id)
        return {k: t for k, t in self.tally.items() if t.count}

    def view(self, now: float, states: list[str]) -> Group:
        s = self.s
        self.update()
        tally = self.count_trials()

        def count(status: str, replica: int | None = None) -> int:
            return _count(tally, status, replica)

        elapsed = s.elapsed_before + now - s.started_at
        remaining = max(0.0, s.deadline_at - now)
        head = Text.assemble(
            ("automlperf ", "bold"), f"{s.path}  ",
            ("elapsed ", "dim"), fmt_duration(elapsed), ("  remaining ", "dim"),
            fmt_duration(remaining), ("  best accuracy ", "dim"),
            f"{self.best:.4f}" if self.best is not None else "-", ("  OPS ", "dim"),
            format_ops(self.ops / self.last if self.last else None), ("  trials ", "dim"),
            f"{count(TrialStatus.COMPLETED)} done, {count(TrialStatus.RUNNING)} running",
            ("  valid so far ", "dim"), self.valid_so_far(), self.notes(now))
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

    def valid_so_far(self) -> str:
        """"yes", or "no (why)": the result's validity if the run ended now, from the best
        accuracy of the counted epochs and what no accuracy mends (``blockers``)."""
        why = list(self.blockers)
        if self.best is None:
            why.append("no accuracy yet")
        elif 1.0 - self.best > self.max_error:
            why.append(f"best error {100 * (1.0 - self.best):.1f} % > {100 * self.max_error:.0f} %")
        return "yes" if not why else f"no ({', '.join(why)})"

    def notes(self, now: float) -> str:
        """The job's end and the staging, where known: ", job ends in H:MM:SS, staged 15/16"."""
        parts = []
        ends = self.context.get("job_ends_at")
        if isinstance(ends, (int, float)):
            parts.append(f"job ends in {fmt_duration(ends - now)}")
        staged = self.context.get("staged")
        if staged:
            parts.append(f"staged {staged[0]}/{staged[1]} nodes")
        return "".join(f", {p}" for p in parts)

    def line(self, now: float, states: list[str]) -> str:
        s = self.s
        self.update()
        best = max(self.best_of_replica.values(), default=None)
        counts = ", ".join(f"{states.count(k)} {k}" for k in dict.fromkeys(states))
        return (f"elapsed {fmt_duration(s.elapsed_before + now - s.started_at)}, remaining "
                f"{fmt_duration(s.deadline_at - now)}, replicas {counts or 'none'}, "
                f"{self.epochs} epochs, best accuracy {best if best is None else round(best, 4)}, "
                f"valid so far {self.valid_so_far()}{self.notes(now)}")


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
        rows.append(("", f"{v['rule']}: {v['detail']}"))
    for r in result.get("retired") or []:
        rows.append(("retired", f"replica {r['replica']} on {r['host']}: {r['reason']}"))
    for k, v in rows:
        table.add_row(k, v)
    return table
