"""The score of a run, from its recorded epochs (pure: plain data in, plain data out).

* Run time is wall-clock time inside the primary's sessions (segments): a run interrupted
  and resumed is not charged for the time it was down. An epoch counts if it ended inside a
  session, before that session's deadline.
* At each 0.1-hour mark t: cumulative ops = ops of the epochs completed by t;
  OPS(t) = cumulative ops / (run time of the last epoch completed by t);
  regulated(t) = OPS(t) * -ln(1 - best accuracy so far). The last mark is the end of the run;
  the score and regulated score are the values there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from automlperf import rules

MARK_S = 360.0  # 0.1 hour
MIN_ERROR = 1e-4  # accuracy 1.0 on a finite validation set: -ln(error) stays finite


class EpochLike(Protocol):
    trial_id: int
    epoch: int
    ended_at: float
    ops: int
    val_accuracy: float
    train_images: int
    val_images: int
    precision: str
    skipped_images: int
    val_skipped: int


class SegmentLike(Protocol):
    started_at: float
    deadline_at: float
    ended_at: float | None
    last_seen: float


@dataclass(frozen=True)
class Mark:
    hours: float
    ops: int
    ops_per_s: float
    best_accuracy: float | None
    regulated: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"hours": self.hours, "ops": self.ops, "ops_per_s": self.ops_per_s,
                "best_accuracy": self.best_accuracy, "regulated": self.regulated}


def segment_bounds(segments: Sequence[SegmentLike]) -> list[tuple[float, float, float]]:
    """(start, end, run-time offset) of each session; its end is where it stopped, never
    after its deadline."""
    out, offset = [], 0.0
    for seg in segments:
        end = seg.ended_at if seg.ended_at is not None else seg.last_seen
        end = max(seg.started_at, min(end, seg.deadline_at))
        out.append((seg.started_at, end, offset))
        offset += end - seg.started_at
    return out


def run_time(wall: float, bounds: Sequence[tuple[float, float, float]]) -> float | None:
    """Run time of a wall-clock instant, or None if it falls outside every session."""
    for start, end, offset in bounds:
        if start <= wall <= end:
            return offset + wall - start
    return None


def counted_epochs(epochs: Iterable[EpochLike],
                   segments: Sequence[SegmentLike]) -> list[tuple[float, EpochLike]]:
    """(run time of its end, epoch) for every epoch that counts, in completion order."""
    bounds = segment_bounds(segments)
    out = []
    for e in epochs:
        t = run_time(e.ended_at, bounds)
        if t is not None:
            out.append((t, e))
    out.sort(key=lambda pair: (pair[0], pair[1].trial_id, pair[1].epoch))
    return out


def regulated(ops_per_s: float, best_accuracy: float | None) -> float | None:
    if best_accuracy is None:
        return None
    return ops_per_s * -math.log(max(1.0 - best_accuracy, MIN_ERROR))


def timeline(counted: Sequence[tuple[float, EpochLike]], elapsed_s: float,
             accuracy_counts: bool = True, step_s: float = MARK_S,
             marks_at: Sequence[float] | None = None) -> list[Mark]:
    """Marks every ``step_s`` of run time and one at the end (or at the run times given)."""
    if marks_at is None:
        marks_at = [step_s * k for k in range(1, int(elapsed_s // step_s) + 1)]
        if not marks_at or marks_at[-1] < elapsed_s - 1e-9:
            marks_at.append(elapsed_s)
    marks, i, ops, last_end, best = [], 0, 0, 0.0, None
    for t in marks_at:
        while i < len(counted) and counted[i][0] <= t + 1e-9:
            end, e = counted[i]
            ops += int(e.ops)
            last_end = end
            if accuracy_counts:
                best = e.val_accuracy if best is None else max(best, e.val_accuracy)
            i += 1
        rate = ops / last_end if last_end > 0 else 0.0
        marks.append(Mark(round(t / 3600.0, 6), ops, rate, best, regulated(rate, best)))
    return marks


def violations(*, dataset: str, dataset_official: bool, fixed_changes: Sequence[str],
               elapsed_s: float, precisions: Iterable[str], error: float | None,
               dataset_detail: str | None = None, unreadable: int = 0,
               ruleset: rules.Ruleset = rules.CURRENT) -> tuple[bool, bool, list[dict[str, str]]]:
    """(official, valid, violations): each rule of the ruleset, checked."""
    found: list[dict[str, str]] = []
    ds = ruleset.dataset
    if dataset != ds.name or not dataset_official:
        detail = (f"trained on {dataset}; an official result needs ImageNet-1k "
                  f"({ds.num_classes:,} classes, {ds.train_images:,} training and "
                  f"{ds.val_images:,} validation images) at {ds.image_size}x{ds.image_size}")
        if dataset_detail:
            detail += f": {dataset_detail}"
        found.append({"rule": "dataset", "detail": detail})
    for change in fixed_changes:
        if not change.startswith(("data.dataset ",)):
            found.append({"rule": "fixed_setting", "detail": f"changed {change}"})
    official = not found
    if unreadable:
        # An official result trains on the whole dataset, not on what a site's copy of it
        # could serve.
        found.append({"rule": "unreadable_images", "detail": f"{unreadable:,} images of the "
                      "counted epochs could not be read; repair the dataset's copy"})
    if elapsed_s < ruleset.min_duration_s:
        found.append({"rule": "duration", "detail": f"ran {elapsed_s / 60:.1f} min; the "
                      f"minimum is {ruleset.min_duration_s / 3600:g} h"})
    low = ruleset.precision_violations(set(precisions))
    if low:
        found.append({"rule": "precision", "detail": f"trained in {', '.join(low)}; allowed: "
                      f"{', '.join(ruleset.allowed_precisions)}"})
    if error is None:
        found.append({"rule": "max_error", "detail": "no accuracy was measured"})
    elif error > ruleset.max_error:
        found.append({"rule": "max_error", "detail": f"best error {100 * error:.1f} % is above "
                      f"the {100 * ruleset.max_error:.0f} % maximum"})
    return official, official and not found, found


def score_run(epochs: Sequence[EpochLike], segments: Sequence[SegmentLike], *, dataset: str,
              dataset_official: bool, fixed_changes: Sequence[str],
              accuracy_counts: bool = True, dataset_detail: str | None = None,
              ruleset: rules.Ruleset = rules.CURRENT) -> dict[str, Any]:
    """The figures of result.json that follow from epochs and sessions alone."""
    bounds = segment_bounds(segments)
    elapsed = bounds[-1][2] + bounds[-1][1] - bounds[-1][0] if bounds else 0.0
    counted = counted_epochs(epochs, segments)
    marks = timeline(counted, elapsed, accuracy_counts)
    final = marks[-1] if marks else Mark(0.0, 0, 0.0, None, None)
    best_epoch = None
    if accuracy_counts and counted:
        best_epoch = max(counted, key=lambda pair: (pair[1].val_accuracy, -pair[0]))[1]
    error = None if final.best_accuracy is None else 1.0 - final.best_accuracy
    unreadable = {"train": sum(e.skipped_images for _, e in counted),
                  "val": sum(e.val_skipped for _, e in counted)}
    official, valid, broken = violations(
        dataset=dataset, dataset_official=dataset_official, fixed_changes=fixed_changes,
        elapsed_s=elapsed, precisions=[e.precision for _, e in counted], error=error,
        dataset_detail=dataset_detail, unreadable=unreadable["train"] + unreadable["val"],
        ruleset=ruleset)
    return {
        "ruleset": ruleset.id,
        "score": final.ops_per_s,
        "regulated_score": final.regulated,
        "best_accuracy": final.best_accuracy,
        "error": error,
        "official": official,
        "valid": valid,
        "violations": broken,
        "total_ops": final.ops,
        "elapsed_s": elapsed,
        "epochs": len(counted),
        "epochs_not_counted": len(epochs) - len(counted),
        "train_images": sum(e.train_images for _, e in counted),
        "val_images": sum(e.val_images for _, e in counted),
        # Images the counted epochs could not read, skipped (see data.max_unreadable).
        "unreadable_images": unreadable,
        "best_trial": best_epoch.trial_id if best_epoch is not None else None,
        "precisions": sorted({e.precision for _, e in counted}),
        "timeline": [m.to_dict() for m in marks],
    }
