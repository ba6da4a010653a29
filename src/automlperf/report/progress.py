"""The search's progress, from a run's trials and counted epochs: the best accuracy over
time (the whole run's and each replica's), the lineage of the best model with what each
ancestor inherited at birth and what it reached, and how often a child the Gaussian process
ranked above its parent did beat it.

Everything here is one pass over the trials and epochs, so a run of 10,000 trials and
500,000 epochs costs a fraction of a second; what goes into a chart is bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from automlperf.measure.score import EpochLike
from automlperf.store import TrialRecord, TrialStatus

# Children of each ancestor drawn beside the lineage (the most accurate ones).
SIBLINGS_SHOWN = 40
# Points of the ranking chart: beyond this many, an even sample (the counts use them all).
RANKING_POINTS = 5000


@dataclass
class Ranking:
    """Completed children with the search's prediction, against the parent's accuracy the
    search ranked by when it chose them (both in the search's currency: the predicted
    accuracy in warm-up rounds, the measured one after)."""

    ranked_above: int = 0  # predicted mean above the parent's accuracy
    improved_when_above: int = 0  # ... and the child's accuracy beat the parent's
    others: int = 0  # predicted at or below the parent
    improved_otherwise: int = 0
    # (predicted gain, reached gain, trial id) per child, in points of accuracy (0..1)
    points: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        return self.improved_when_above / self.ranked_above if self.ranked_above else None

    @property
    def base_rate(self) -> float | None:
        return self.improved_otherwise / self.others if self.others else None


def gp_ranking(trials: Sequence[TrialRecord]) -> Ranking:
    """How the Gaussian process's ranking of children above their parent held up. Trials
    recorded before predictions were (or by a search without a process) are left out."""
    out = Ranking()
    for t in trials:
        mean = t.hparams.get("predicted_mean")
        parent = t.hparams.get("parent_accuracy")
        reached = t.search_accuracy
        if mean is None or parent is None or reached is None or \
                t.status != TrialStatus.COMPLETED:
            continue
        improved = reached > parent
        if mean > parent:
            out.ranked_above += 1
            out.improved_when_above += improved
        else:
            out.others += 1
            out.improved_otherwise += improved
        out.points.append((mean - parent, reached - parent, t.id))
    if len(out.points) > RANKING_POINTS:
        step = len(out.points) / RANKING_POINTS
        out.points = [out.points[int(i * step)] for i in range(RANKING_POINTS)]
    return out


def best_over_time(counted: Sequence[tuple[float, EpochLike]],
                   replica_of: dict[int, int]) -> tuple[list[tuple[float, float]],
                                                        dict[int, list[tuple[float, float]]]]:
    """(run time, best accuracy so far) at each improvement: the whole run's, and each
    replica's own. Only improvements are kept, so the steps stay few however long the run."""
    whole: list[tuple[float, float]] = []
    mine: dict[int, list[tuple[float, float]]] = {}
    for t, e in counted:
        acc = e.val_accuracy
        if not whole or acc > whole[-1][1]:
            whole.append((t, acc))
        steps = mine.setdefault(replica_of.get(e.trial_id, -1), [])
        if not steps or acc > steps[-1][1]:
            steps.append((t, acc))
    return whole, dict(sorted(mine.items()))


def lineage(chain: Sequence[int], trials: dict[int, TrialRecord], inherit: bool,
            morph_text: Any) -> tuple[list[dict[str, Any]], list[list[tuple[int, float]]]]:
    """The best model's line, first ancestor first: each member's trial, parent, morphs,
    the accuracy it had at birth (its parent's best: a morph keeps the function and the
    child starts from the weights saved at that epoch; None when it started from fresh
    weights) and the accuracy it reached; and, per generation after the first, the other
    children of the ancestor before it (trial, accuracy), the most accurate first."""
    children: dict[int, list[TrialRecord]] = {}
    on_line = set(chain)
    for t in trials.values():
        if t.parent_id in on_line and t.id not in on_line and t.best_accuracy is not None:
            children.setdefault(t.parent_id, []).append(t)
    nodes, siblings = [], []
    for depth, tid in enumerate(chain):
        t = trials[tid]
        parent = trials.get(t.parent_id) if t.parent_id is not None else None
        birth = parent.best_accuracy if parent is not None and inherit else None
        nodes.append({"id": t.id, "parent": t.parent_id, "round": t.round, "depth": depth,
                      "morphs": morph_text(t.morphs), "morph_list": t.morphs, "birth": birth,
                      "reached": t.best_accuracy,
                      "epochs": t.epochs_done, "replica": t.replica_index,
                      "predicted_mean": t.hparams.get("predicted_mean")})
        if depth:
            others = sorted(children.get(chain[depth - 1], []),
                            key=lambda c: -(c.best_accuracy or 0.0))
            siblings.append([(c.id, c.best_accuracy or 0.0) for c in others[:SIBLINGS_SHOWN]])
    return nodes, siblings


def progress(counted: Sequence[tuple[float, EpochLike]], trials: dict[int, TrialRecord],
             chain: Sequence[int], inherit: bool, morph_text: Any) -> dict[str, Any]:
    """What the report's search-progress section shows."""
    whole, per_replica = best_over_time(counted, {i: t.replica_index for i, t in trials.items()})
    nodes, siblings = lineage(chain, trials, inherit, morph_text)
    # The lines run on to the last counted epoch: a flat stretch is time spent without gain.
    end = max((t for t, _ in counted), default=0.0)
    return {"whole": whole, "per_replica": per_replica, "end": end, "lineage": nodes,
            "siblings": siblings, "ranking": gp_ranking(list(trials.values())),
            "inherit": inherit, "siblings_shown": SIBLINGS_SHOWN}
