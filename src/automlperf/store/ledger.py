"""A run's epochs on both sides: each trial's own log (``trials/<id>/log.jsonl``, written
first) and the store (written second), compared in both directions.

A replica appends an epoch to its trial's log, then records it in the store
(runner/trials.py ``TrialRecorder``). An epoch in a log and not in the store was trained
and lost on its way (the store went down, the replica was killed between the two writes);
an epoch in the store and not in its log was never reported by the trial that holds it.
Both are named by ``check``; the primary gives the store what the logs hold before it
counts (runner/recovery.py), so a run loses nothing a log kept. A trial's outcome (the last
line of its log) is compared the same way, for the store to take it where it has none;
except where the store failed the trial because its replica stopped heart-beating: a
replica stopped between logging the outcome and finishing the trial in the store leaves
that trial to the lease, whose verdict stands (its epochs, all stored, still count).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automlperf.events import TrialStatus, read_jsonl
from automlperf.store.base import LEASE_EXPIRED, EpochRecord, TrialRecord

Key = tuple[int, int]  # (trial, epoch)
LOG = "log.jsonl"


@dataclass
class Logs:
    """What the trial logs hold: every epoch by (trial, epoch), the keys that appear more
    than once, and each trial's outcome (its last ``trial`` line)."""

    epochs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    repeated: list[Key] = field(default_factory=list)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, trial_id: int, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            if rec.get("type") == "epoch":
                key = (trial_id, int(rec["epoch"]))
                if key in self.epochs:
                    self.repeated.append(key)
                    continue
                rec.setdefault("val_skipped", 0)  # logs written before it was counted
                self.epochs[key] = rec
            elif rec.get("type") == "trial":
                self.outcomes[trial_id] = rec


def read_logs(trial_folder: Any, trial_ids: Iterable[int]) -> Logs:
    """The logs of ``trial_ids``, each in ``trial_folder(id)``; a trial without one (killed
    before its first line) holds nothing."""
    logs = Logs()
    for trial_id in trial_ids:
        path = Path(trial_folder(trial_id)) / LOG
        if path.exists():
            logs.add(trial_id, read_jsonl(path))
    return logs


@dataclass
class Ledger:
    """Where the two sides differ. ``logged_only``: epochs a log holds and the store lost;
    ``stored_only``: stored epochs their trial's log does not hold; ``repeated``: epochs a
    log holds twice; ``outcomes``: (trial, logged status, stored status) of trials whose log
    ends with an outcome the store does not hold."""

    logged: int = 0
    stored: int = 0
    logged_only: list[Key] = field(default_factory=list)
    stored_only: list[Key] = field(default_factory=list)
    repeated: list[Key] = field(default_factory=list)
    outcomes: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Records one side holds and the other lost."""
        return len(self.logged_only) + len(self.stored_only) + len(self.outcomes)

    def problems(self, limit: int = 20) -> list[str]:
        """The epochs on one side only, the repeated ones and the outcomes the two sides
        tell differently, one line each (at most ``limit`` of a kind, then how many more)."""
        out: list[str] = []
        for keys, said in (
                (self.logged_only, "is in its trial's log but not in the store (lost on its "
                                   "way to the store)"),
                (self.stored_only, "is in the store but not in its trial's log"),
                (self.repeated, "appears more than once in its trial's log")):
            out += [f"trial {t} epoch {e} {said}" for t, e in sorted(keys)[:limit]]
            if len(keys) > limit:
                out.append(f"... and {len(keys) - limit} more epoch(s) that {said.split(' (')[0]}")
        out += [f"trial {t}: its log ends {logged}, but the store says {stored}"
                for t, logged, stored in self.outcomes[:limit]]
        if len(self.outcomes) > limit:
            out.append(f"... and {len(self.outcomes) - limit} more trial(s) whose log and "
                       "store tell their outcome differently")
        return out


def compare(epochs: Iterable[EpochRecord], trials: Iterable[TrialRecord], logs: Logs) -> Ledger:
    """The store's ``epochs`` and ``trials`` held against the trials' ``logs``."""
    stored = {(e.trial_id, e.epoch) for e in epochs}
    ledger = Ledger(logged=len(logs.epochs) + len(logs.repeated), stored=len(stored),
                    repeated=list(logs.repeated))
    ledger.logged_only = sorted(logs.epochs.keys() - stored)
    ledger.stored_only = sorted(stored - logs.epochs.keys())
    for t in trials:
        said = logs.outcomes.get(t.id)
        if said is None:
            continue
        status = TrialStatus.of_outcome(said.get("status", ""))
        lapsed = t.status == TrialStatus.FAILED and t.reason == LEASE_EXPIRED
        if status != t.status and not lapsed:
            ledger.outcomes.append((t.id, str(status), str(t.status)))
    return ledger
