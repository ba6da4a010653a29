"""A replica's trials as records, and when their failures mean the replica gives up.

* :class:`TrialRecorder`: where a trial's events go (its ``log.jsonl`` and the run's store).
* :func:`conclusion`: what the store records of a trial's end; the replica records it, and the
  primary's recovery (runner/recovery.py) rebuilds it from the trial's log.
* :class:`FailureStreak` and :func:`why_giving_up`: one failing architecture is the search's
  business, but trials failing alike again and again (or a full disk) mean the replica cannot
  do its job, and it says why in one line (runner/replica.py ``Replica.run``).
"""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.events import EpochEvent, FailureKind, JsonlSink, TrialOutcome
from automlperf.search.curve import predict_final
from automlperf.store import EpochRecord, Store, TrialStatus
from automlperf.train.spec import TrainerError

log = logging.getLogger("automlperf.replica")

# What to do about a failure that repeats, by the trainer's failure kind.
FIXES: dict[FailureKind, str] = {
    FailureKind.OOM: "lower train.batch_size (or data.image_size) in the configuration, or "
                     "give each replica more memory (a job's or container's memory limit)",
    FailureKind.NAN: "lower train.lr_per_256 or raise train.warmup_epochs in the configuration",
    FailureKind.DATA: "check the dataset: `automlperf train --dataset ... --data-dir ...` shows "
                      "the problem on its own",
    FailureKind.CRASH: "a training process died: look for the system killing it (host memory, "
                       "the job's limits) in {log}",
}


class TrialRecorder:
    """The :class:`~automlperf.events.EventSink` a trial's events go to: the trial's
    ``log.jsonl`` and the run's store; it keeps the validation accuracies for the replica."""

    def __init__(self, store: Store, run_id: int, trial_id: int, folder: Path) -> None:
        self.store = store
        self.run_id = run_id
        self.trial_id = trial_id
        self.log = JsonlSink(folder / "log.jsonl")
        self.accuracies: list[float] = []

    def epoch(self, event: EpochEvent) -> None:
        self.log.epoch(event)
        self.store.record_epoch(EpochRecord(**{**event.to_dict(), "trial_id": self.trial_id},
                                            run_id=self.run_id))
        self.accuracies.append(event.val_accuracy)
        log.info("trial %d epoch %d: val acc %.4f, %.3e ops, %.0f img/s", self.trial_id,
                 event.epoch, event.val_accuracy, event.ops, event.images_per_s)

    def trial(self, outcome: TrialOutcome) -> None:
        self.log.trial(outcome)
        self.log.close()


def conclusion(outcome: TrialOutcome, accuracies: list[float], weights_out: str | None,
               round_index: int, config: Config) -> dict[str, Any]:
    """What the store records of a trial that ended with ``outcome`` after the epochs of
    ``accuracies``: the arguments of ``Store.finish_trial`` but the time. The replica records
    it; the primary rebuilds it from the trial's log when the store lost it
    (runner/recovery.py)."""
    predicted = None
    if round_index < config.search.hpo_start_round and accuracies:
        predicted = predict_final(accuracies, config.train.max_epochs)
    # A trial cut short (deadline, crash) still has the epochs it reported, and the weights
    # saved at the best of them.
    best = max(accuracies) if accuracies else None
    weights = weights_out if accuracies and weights_out and Path(weights_out).exists() else None
    extra = {"early_stopped": outcome.early_stopped, "precision": outcome.precision,
             "batch_size": outcome.batch_size,
             "best_epoch": accuracies.index(max(accuracies)) if accuracies else None,
             **outcome.extra}
    return {"status": TrialStatus.of_outcome(outcome.status), "reason": outcome.reason,
            "best_accuracy": best, "predicted_accuracy": predicted, "weights_path": weights,
            "extra": extra}


class CannotTrain(RuntimeError):
    """Trials keep failing for the same reason: the replica cannot do its job."""


def _reason_key(reason: str) -> str:
    # Sizes, counts and ids differ between occurrences of the same failure, and so does the
    # example a reason may end with (an unreadable file, say).
    return re.sub(r"\d+(\.\d+)?", "#", re.sub(r" \(e\.g\. .*$", "", reason))


def repeated_failure(reasons: list[str], limit: int) -> str | None:
    """The reason, when the last ``limit`` trials all failed alike (numbers aside)."""
    if len(reasons) < limit:
        return None
    last = reasons[-limit:]
    return last[-1] if len({_reason_key(r) for r in last}) == 1 else None


class FailureStreak:
    """The reasons of a replica's trials failed in a row; ``limit`` alike is one too many.
    ``log_name`` is the replica's log, which a fix may point to."""

    def __init__(self, limit: int, log_name: str) -> None:
        self.limit = limit
        self.log_name = log_name
        self.reasons: list[str] = []

    def note(self, status: str, reason: str, kind: str | None) -> None:
        """A trial ended with ``status`` (``reason``, the trainer's failure ``kind``); raises
        :class:`CannotTrain`, with the fix, when the streak has become a repeated failure."""
        if status == TrialStatus.COMPLETED:
            self.reasons.clear()
        if status != TrialStatus.FAILED:
            return
        self.reasons.append(reason or "failed")
        repeated = repeated_failure(self.reasons, self.limit)
        if repeated is not None:
            unknown = "see {log} for the traceback"
            fix = FIXES.get(FailureKind(kind), unknown) if kind in set(FailureKind) else unknown
            fix = fix.format(log=self.log_name)
            raise CannotTrain(f"{self.limit} trials in a row failed with \"{repeated}\"; {fix}")


def why_giving_up(exc: Exception, run_dir: Path) -> str | None:
    """Why a replica of the run in ``run_dir`` gives up on ``exc``, recorded for the primary
    (which retires the replica in one line and ends the run only when none is left); None:
    a bug, which the replica raises."""
    if isinstance(exc, (CannotTrain, TrainerError)):
        # A trainer that cannot start, or can no longer bring its accelerators back, and a
        # failure that keeps repeating.
        return str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        # Nothing the replica can fix: the run stops, resumable once there is room.
        return (f"no space left on the disk of {exc.filename or run_dir}: free space there, "
                f"then `automlperf run --resume --run-dir {run_dir}`")
    return None
