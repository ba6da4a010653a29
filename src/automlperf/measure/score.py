"""The score of a run, from its recorded epochs (pure: plain data in, plain data out).

* Run time is wall-clock time inside the primary's sessions (segments): a run interrupted
  and resumed is not charged for the time it was down. An epoch counts if it ended inside a
  session, before that session's deadline; under a ruleset that charges each replica its
  own time, an epoch in flight at the deadline of a session that reached it also counts if
  it ended within the grace after it (``grace_s``).
* How time is charged is the ruleset's rule (``Ruleset.charge``):

  - ``last_epoch`` (aiperf-2021.1, and the AIPerf reference's score.py): at each 0.1-hour
    mark t, OPS(t) = ops of the epochs completed by t / run time of the last of them. With
    several replicas, the others' epochs in flight at that time are charged, never counted.
  - ``per_replica``: each replica's time is its own. At each mark t, a replica's epochs that
    started before t count, and it is charged from the run's start to t or to the end of
    the last of them, whichever is later; OPS(t) is the sum of the replicas' ops / charged
    time. No replica is charged less than t, and no counted operation is left uncharged or
    charged to an idle replica.

  regulated(t) = OPS(t) * -ln(1 - best accuracy so far). The last mark is the end of the
  run; the score and regulated score are the values there. From aiperf-2021.3 the best
  accuracy comes only from epochs that ended by the deadline: work in the grace counts
  towards the operations, never towards the accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from automlperf import rules

MARK_S = 360.0  # 0.1 hour
MIN_ERROR = 1e-4  # accuracy 1.0 on a finite validation set: -ln(error) stays finite


class EpochLike(Protocol):
    trial_id: int
    epoch: int
    started_at: float
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


def _grace_run_time(e: EpochLike, segments: Sequence[SegmentLike],
                    bounds: Sequence[tuple[float, float, float]], grace_s: float) -> float | None:
    """Run time of the end of an epoch in flight at the deadline of a session that reached
    it, if it ended within the grace (None otherwise)."""
    for seg, (start, end, offset) in zip(segments, bounds):
        reached = end >= seg.deadline_at
        if reached and start <= e.started_at < end and end < e.ended_at <= end + grace_s:
            return offset + e.ended_at - start
    return None


def counted_epochs(epochs: Iterable[EpochLike], segments: Sequence[SegmentLike],
                   grace_s: float = 0.0) -> list[tuple[float, EpochLike]]:
    """(run time of its end, epoch) for every epoch that counts, in completion order; with a
    ``grace_s``, an epoch in flight at a reached deadline counts if it ended within it."""
    bounds = segment_bounds(segments)
    out = []
    for e in epochs:
        t = run_time(e.ended_at, bounds)
        if t is None and grace_s > 0:
            t = _grace_run_time(e, segments, bounds, grace_s)
        if t is not None:
            out.append((t, e))
    out.sort(key=lambda pair: (pair[0], pair[1].trial_id, pair[1].epoch))
    return out


@dataclass(frozen=True)
class Span:
    """A counted epoch in run time, with the replica that trained it."""

    start: float
    end: float
    replica: int
    epoch: EpochLike
    in_grace: bool = False  # ended after its session's deadline, inside the grace


def spans(counted: Sequence[tuple[float, EpochLike]], segments: Sequence[SegmentLike],
          replica_of: Mapping[int, int]) -> list[Span]:
    """The counted epochs as spans of run time, by start. An epoch's start is clipped to its
    session's start (a replica's clock may run a little ahead of the primary's)."""
    bounds = segment_bounds(segments)
    out = []
    for end, e in counted:
        # The session the epoch ended in (or, in the grace, after): the last to start before.
        offset = next((o for start, _, o in reversed(bounds) if start <= e.ended_at), 0.0)
        start = max(offset, end - max(0.0, e.ended_at - e.started_at))
        out.append(Span(start, end, replica_of.get(e.trial_id, -1), e,
                        run_time(e.ended_at, bounds) is None))
    out.sort(key=lambda s: (s.start, s.end, s.epoch.trial_id, s.epoch.epoch))
    return out


def replica_timeline(spans_by_start: Sequence[Span], elapsed_s: float,
                     accuracy_counts: bool = True, step_s: float = MARK_S,
                     marks_at: Sequence[float] | None = None,
                     accuracy_in_grace: bool = True) -> tuple[list[Mark], dict[int, float]]:
    """The ``per_replica`` marks (see the module's docstring), and each replica's charged
    run time at the last mark. Every counted epoch counts at the last mark; its accuracy
    only if it ended by the deadline, unless ``accuracy_in_grace``."""
    if marks_at is None:
        marks_at = _marks(elapsed_s, step_s)
    ops: dict[int, int] = {}
    last_end: dict[int, float] = {}
    marks, i, best = [], 0, None
    for k, t in enumerate(marks_at):
        final = k == len(marks_at) - 1
        while i < len(spans_by_start) and (final or spans_by_start[i].start < t - 1e-9):
            span = spans_by_start[i]
            ops[span.replica] = ops.get(span.replica, 0) + int(span.epoch.ops)
            last_end[span.replica] = max(last_end.get(span.replica, 0.0), span.end)
            if accuracy_counts and (accuracy_in_grace or not span.in_grace):
                acc = span.epoch.val_accuracy
                best = acc if best is None else max(best, acc)
            i += 1
        charged = {r: max(t, last_end[r]) for r in ops}
        rate = sum(ops[r] / charged[r] for r in ops if charged[r] > 0)
        marks.append(Mark(round(t / 3600.0, 6), sum(ops.values()), rate, best,
                          regulated(rate, best)))
    t_end = marks_at[-1] if marks_at else 0.0
    return marks, {r: max(t_end, last_end[r]) for r in sorted(ops)}


def _marks(elapsed_s: float, step_s: float) -> list[float]:
    marks_at = [step_s * k for k in range(1, int(elapsed_s // step_s) + 1)]
    if not marks_at or marks_at[-1] < elapsed_s - 1e-9:
        marks_at.append(elapsed_s)
    return marks_at


def regulated(ops_per_s: float, best_accuracy: float | None) -> float | None:
    if best_accuracy is None:
        return None
    return ops_per_s * -math.log(max(1.0 - best_accuracy, MIN_ERROR))


def timeline(counted: Sequence[tuple[float, EpochLike]], elapsed_s: float,
             accuracy_counts: bool = True, step_s: float = MARK_S,
             marks_at: Sequence[float] | None = None) -> list[Mark]:
    """Marks every ``step_s`` of run time and one at the end (or at the run times given)."""
    if marks_at is None:
        marks_at = _marks(elapsed_s, step_s)
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
               ruleset: rules.Ruleset = rules.CURRENT,
               duration_s: float | None = None) -> tuple[bool, bool, list[dict[str, str]]]:
    """(official, valid, violations): each rule of the ruleset, checked (the run's
    ``duration_s``, where the ruleset fixes which durations a result may have)."""
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
    elif duration_s is not None and ruleset.max_short_s is not None and \
            elapsed_s < duration_s - ruleset.max_short_s:
        found.append({"rule": "duration", "detail": f"ran {elapsed_s:,.0f} s of its "
                      f"{duration_s:,.0f}: a run ends at its deadline (a round limit or an "
                      "end before it leaves a result of another length)"})
    if duration_s is not None and duration_s >= ruleset.min_duration_s:
        problem = ruleset.duration_problem(duration_s)
        if problem:
            found.append({"rule": "duration", "detail": problem})
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


@dataclass(frozen=True)
class NodeCeiling:
    """What the bound knows of one replica's node: who it is, the ceiling it measured (None:
    none), whether it trains on accelerators, the data-sheet peak of those it trained on
    (None: not known for every one), and why it has no ceiling, where it said."""

    replica: int
    host: str
    ceiling_ops: float | None
    accelerator: bool
    peak_ops: float | None = None
    error: str | None = None


def ceiling_violations(score: float, nodes: Sequence[NodeCeiling],
                       ruleset: rules.Ruleset = rules.CURRENT) -> list[dict[str, str]]:
    """The violations of a score above what the nodes that earned it measured they can do:
    a node without a ceiling (where the ruleset needs one), a ceiling above its
    accelerators' data sheet, a score above the ruleset's multiple of the ceilings."""
    found = []
    missing = [n for n in nodes if not n.ceiling_ops]
    if ruleset.ceiling_required and (missing or not nodes):
        named = "; ".join(f"replica {n.replica} on {n.host}"
                          + (f" ({n.error})" if n.error else "") for n in missing) \
            or "no node described itself"
        found.append({"rule": "ceiling", "detail": f"no measured ceiling: {named}; the "
                      "implausibility bound needs every node's: measure it again "
                      "(`automlperf doctor`), then run again"})
    limit = ruleset.max_ceiling_of_peak
    for n in nodes:
        if limit is not None and n.ceiling_ops and n.peak_ops and \
                n.ceiling_ops > limit * n.peak_ops:
            found.append({"rule": "implausible", "detail": f"replica {n.replica} on {n.host}: "
                          f"its ceiling ({n.ceiling_ops:.4g} OPS) is "
                          f"{n.ceiling_ops / n.peak_ops:.2f} times its accelerators' "
                          f"data-sheet peak ({n.peak_ops:.4g} OPS); at most {limit:g} is "
                          "plausible: check the records"})
    wrong = implausible(score, nodes, ruleset)
    if wrong is not None:
        found.append(wrong)
    return found


def plausible_limit(nodes: Sequence[NodeCeiling],
                    ruleset: rules.Ruleset = rules.CURRENT) -> float | None:
    """The highest plausible score: each node's ceiling times the ruleset's multiple for
    its kind (None: not judged; every node must have a ceiling)."""
    cpu = ruleset.max_fraction_of_ceiling
    if cpu is None or not nodes or not all(n.ceiling_ops for n in nodes):
        return None
    accel = ruleset.max_fraction_of_accelerator_ceiling or cpu
    return sum((accel if n.accelerator else cpu) * float(n.ceiling_ops or 0) for n in nodes)


def implausible(score: float, nodes: Sequence[NodeCeiling],
                ruleset: rules.Ruleset = rules.CURRENT) -> dict[str, str] | None:
    """The violation of a score above the plausible multiple of its nodes' ceilings."""
    limit = plausible_limit(nodes, ruleset)
    if limit is None or score <= limit:
        return None
    ceiling = sum(float(n.ceiling_ops or 0) for n in nodes)
    return {"rule": "implausible", "detail": f"the score ({score:.4g} OPS) is "
            f"{score / ceiling:.2f} times the ceiling its nodes measured ({ceiling:.4g} OPS); "
            f"at most {limit / ceiling:.2f} is plausible ({_factors(nodes, ruleset)}): check "
            "the records, or measure the nodes again (`automlperf doctor`)"}


def _factors(nodes: Sequence[NodeCeiling], ruleset: rules.Ruleset) -> str:
    cpu = ruleset.max_fraction_of_ceiling
    accel = ruleset.max_fraction_of_accelerator_ceiling or cpu
    kinds = {n.accelerator for n in nodes}
    said = [f"{accel:g} of an accelerator node's" for k in (True,) if k in kinds]
    said += [f"{cpu:g} of a CPU node's" for k in (False,) if k in kinds]
    return " and ".join(said)


def score_run(epochs: Sequence[EpochLike], segments: Sequence[SegmentLike], *, dataset: str,
              dataset_official: bool, fixed_changes: Sequence[str],
              accuracy_counts: bool = True, dataset_detail: str | None = None,
              ruleset: rules.Ruleset = rules.CURRENT, replica_of: Mapping[int, int] | None = None,
              grace_s: float = 0.0, duration_s: float | None = None) -> dict[str, Any]:
    """The figures of result.json that follow from epochs and sessions alone, and, for a
    ruleset that charges each replica its own time, from which replica trained each trial
    (``replica_of``) and the grace after the deadline (``grace_s``)."""
    bounds = segment_bounds(segments)
    elapsed = bounds[-1][2] + bounds[-1][1] - bounds[-1][0] if bounds else 0.0
    per_replica = ruleset.charge == "per_replica"
    grace_s = grace_s if per_replica else 0.0
    counted = counted_epochs(epochs, segments, grace_s)
    if per_replica:
        marks, charged = replica_timeline(spans(counted, segments, replica_of or {}), elapsed,
                                          accuracy_counts,
                                          accuracy_in_grace=ruleset.accuracy_in_grace)
    else:
        marks = timeline(counted, elapsed, accuracy_counts)
        charged = {}
    final = marks[-1] if marks else Mark(0.0, 0, 0.0, None, None)
    best_epoch = None
    measured = counted
    if not ruleset.accuracy_in_grace:
        measured = [(t, e) for t, e in counted if run_time(e.ended_at, bounds) is not None]
    if accuracy_counts and measured:
        best_epoch = max(measured, key=lambda pair: (pair[1].val_accuracy, -pair[0]))[1]
    error = None if final.best_accuracy is None else 1.0 - final.best_accuracy
    unreadable = {"train": sum(e.skipped_images for _, e in counted),
                  "val": sum(e.val_skipped for _, e in counted)}
    official, valid, broken = violations(
        dataset=dataset, dataset_official=dataset_official, fixed_changes=fixed_changes,
        elapsed_s=elapsed, precisions=[e.precision for _, e in counted], error=error,
        dataset_detail=dataset_detail, unreadable=unreadable["train"] + unreadable["val"],
        ruleset=ruleset, duration_s=duration_s)
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
        # How run time was charged: the ruleset's rule, the grace in flight epochs had after
        # the deadline, and each replica's charged run time (per_replica only).
        "charging": {"rule": ruleset.charge, "grace_s": grace_s,
                     "replica_s": {str(r): round(c, 6) for r, c in charged.items()}},
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
