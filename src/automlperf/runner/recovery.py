"""The store given back what the trial logs kept. A replica logs an epoch before it stores it
(runner/trials.py ``TrialRecorder``) and logs a trial's outcome before it finishes the
trial in the store; a store that goes down past its retry limit, or a replica killed
between the two writes, leaves the log ahead of the store. Before the primary counts a
session's epochs (when it finishes, and when a run is resumed) it records every epoch a log
holds and the store does not, and finishes with its logged outcome each trial the store
still holds running. ``check`` then finds both sides alike (store/ledger.py).

Only trials whose log can be ahead are read: those whose replica did not end them itself
(still running in the store, or ended because their replica stopped heart-beating), since a
replica ends a trial in the store only after every epoch it logged was stored. Of those,
a log is parsed only when it logged more epochs than the store holds for the trial, or an
outcome while the store holds it running (counted in the raw text).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from automlperf.config import Config
from automlperf.events import TrialOutcome, TrialStatus, read_jsonl
from automlperf.runner.trials import conclusion
from automlperf.store import EpochRecord, Store, TrialRecord
from automlperf.store.base import EPOCH_FIELDS, LEASE_EXPIRED, StoreError
from automlperf.store.ledger import LOG, Logs
from automlperf.store.rundir import RunDir

log = logging.getLogger("automlperf.recovery")
_OUTCOME_FIELDS = {f.name for f in dataclasses.fields(TrialOutcome)}


@dataclass
class Recovered:
    """What the store took from the logs: epochs, and trials finished with their logged
    outcome."""

    epochs: int = 0
    outcomes: int = 0

    def __bool__(self) -> bool:
        return bool(self.epochs or self.outcomes)

    def describe(self) -> str:
        return (f"recovered from the trial logs what the store had lost: {self.epochs} "
                f"epoch(s), {self.outcomes} trial outcome(s)")


def _ahead(path: Path, trial: TrialRecord) -> bool:
    """Whether the log at ``path`` may hold what the store lacks for ``trial``."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return False
    epochs = text.count(b'"type": "epoch"')
    outcome = b'"type": "trial"' in text
    return epochs > trial.epochs_done or (outcome and trial.status == TrialStatus.RUNNING)


def recover(store: Store, rd: RunDir, run_id: int, config: Config) -> Recovered:
    """Give the store what the trial logs of run ``run_id`` hold and it lost."""
    done = Recovered()
    for trial in store.trials(run_id):
        if trial.status != TrialStatus.RUNNING and trial.reason != LEASE_EXPIRED:
            continue
        path = rd.trial(trial.id) / LOG
        if not _ahead(path, trial):
            continue
        logs = Logs()
        logs.add(trial.id, read_jsonl(path))
        mine = sorted((key, rec) for key, rec in logs.epochs.items())
        for (_, _epoch), rec in mine:
            fields = {k: v for k, v in rec.items() if k in EPOCH_FIELDS}
            try:
                store.record_epoch(EpochRecord(**{**fields, "trial_id": trial.id},
                                               run_id=run_id))
            except StoreError as exc:
                # Recorded otherwise already: `check` names the difference.
                log.warning("trial %d epoch %d: %s", trial.id, _epoch, exc)
        after = store.trial(trial.id)
        done.epochs += after.epochs_done - trial.epochs_done
        said = logs.outcomes.get(trial.id)
        if said is not None and after.status == TrialStatus.RUNNING:
            outcome = TrialOutcome(**{k: v for k, v in said.items() if k in _OUTCOME_FIELDS})
            accuracies = [rec["val_accuracy"] for _, rec in mine]
            ending = conclusion(outcome, accuracies,
                                str(rd.trial(trial.id) / "weights.safetensors"), trial.round,
                                config)
            # When the outcome was written: the log's last line.
            if store.finish_trial(trial.id, now=path.stat().st_mtime, **ending):
                done.outcomes += 1
    if done:
        log.warning("%s", done.describe())
    return done
