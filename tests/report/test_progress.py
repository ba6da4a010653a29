"""The search's progress as the report shows it: best accuracy over time, the best model's
lineage with what it inherited, and how the Gaussian process's ranking held up."""

from dataclasses import dataclass

from automlperf.report import charts
from automlperf.report.progress import (RANKING_POINTS, SIBLINGS_SHOWN, best_over_time,
                                        gp_ranking, lineage, progress)
from automlperf.store import TrialRecord


def trial(id, parent=None, best=None, predicted=None, replica=0, status="completed",
          mean=None, parent_acc=None, morphs=None):
    hparams = {"batch_size": 64, "kernel_size": 3}
    if mean is not None:
        hparams.update(predicted_mean=mean, parent_accuracy=parent_acc)
    return TrialRecord(id=id, run_id=1, replica_index=replica, replica_id=None, graph_hash=f"h{id}",
                       graph_json="{}", parent_id=parent,
                       morphs=morphs if morphs is not None else [{"op": "deepen", "kernel": 3}],
                       round=0, hparams=hparams, status=status, reason="", created_at=0.0,
                       finished_at=1.0, lease_until=None, best_accuracy=best,
                       predicted_accuracy=predicted, epochs_done=3, weights_path=None)


@dataclass
class Epoch:
    trial_id: int
    val_accuracy: float


def test_best_over_time_keeps_only_improvements_per_run_and_per_replica():
    counted = [(1.0, Epoch(1, 0.5)), (2.0, Epoch(2, 0.4)), (3.0, Epoch(1, 0.6)),
               (4.0, Epoch(2, 0.55)), (5.0, Epoch(2, 0.7)), (6.0, Epoch(1, 0.65))]
    whole, mine = best_over_time(counted, {1: 0, 2: 3})
    assert whole == [(1.0, 0.5), (3.0, 0.6), (5.0, 0.7)]
    assert mine == {0: [(1.0, 0.5), (3.0, 0.6), (6.0, 0.65)],
                    3: [(2.0, 0.4), (4.0, 0.55), (5.0, 0.7)]}


def test_the_lineage_starts_each_child_at_its_parents_best():
    trials = {1: trial(1, best=0.6, morphs=[]), 2: trial(2, 1, 0.8), 3: trial(3, 1, 0.7),
              4: trial(4, 2, 0.9), 5: trial(5, 2, 0.85), 6: trial(6, 2, None, status="failed")}
    nodes, siblings = lineage([1, 2, 4], trials, True, lambda m: str(len(m)))
    assert [(n["id"], n["birth"], n["reached"]) for n in nodes] == [
        (1, None, 0.6), (2, 0.6, 0.8), (4, 0.8, 0.9)]
    assert [n["depth"] for n in nodes] == [0, 1, 2] and nodes[1]["morphs"] == "1"
    # The other children of each ancestor, most accurate first; none without an accuracy.
    assert siblings == [[(3, 0.7)], [(5, 0.85)]]
    fresh, _ = lineage([1, 2, 4], trials, False, str)
    assert all(n["birth"] is None for n in fresh)


def test_siblings_are_bounded():
    trials = {1: trial(1, best=0.5)}
    trials.update({i: trial(i, 1, i / 10_000) for i in range(2, 2000)})
    _, siblings = lineage([1, 1999], trials, True, str)
    assert len(siblings[0]) == SIBLINGS_SHOWN and siblings[0][0] == (1998, 0.1998)


def test_the_ranking_counts_children_predicted_above_their_parent():
    trials = [
        trial(1, best=0.5),  # the seed: no prediction
        trial(2, 1, 0.6, mean=0.55, parent_acc=0.5),  # ranked above, improved
        trial(3, 1, 0.45, mean=0.52, parent_acc=0.5),  # ranked above, did not
        trial(4, 1, 0.55, mean=0.49, parent_acc=0.5),  # ranked below, improved
        trial(5, 1, 0.4, mean=0.45, parent_acc=0.5),  # ranked below, did not
        trial(6, 1, 0.48, predicted=0.7, mean=0.6, parent_acc=0.5),  # predicted accuracy counts
        trial(7, 1, 0.9, mean=0.6, parent_acc=0.5, status="stopped"),  # cut short: left out
    ]
    r = gp_ranking(trials)
    assert (r.ranked_above, r.improved_when_above, r.others, r.improved_otherwise) == (3, 2, 2, 1)
    assert r.share == 2 / 3 and r.base_rate == 0.5
    assert [p[2] for p in r.points] == [2, 3, 4, 5, 6]
    assert abs(r.points[0][0] - 0.05) < 1e-12 and abs(r.points[0][1] - 0.1) < 1e-12
    none = gp_ranking([trial(1, best=0.5)])
    assert none.share is None and none.base_rate is None and not none.points


def test_ranking_points_are_bounded():
    trials = [trial(i, 1, 0.5, mean=0.6, parent_acc=0.5) for i in range(2, 3 * RANKING_POINTS)]
    r = gp_ranking(trials)
    assert r.ranked_above == len(trials) and len(r.points) == RANKING_POINTS


def test_the_charts_draw_what_progress_gathers():
    trials = {1: trial(1, best=0.6, morphs=[], replica=0),
              2: trial(2, 1, 0.8, mean=0.7, parent_acc=0.6, replica=1,
                       morphs=[{"op": "deepen", "kernel": 5}, {"op": "skip", "projection": True}]),
              3: trial(3, 1, 0.5, mean=0.55, parent_acc=0.6, replica=0)}
    counted = [(10.0, Epoch(1, 0.6)), (20.0, Epoch(2, 0.8)), (25.0, Epoch(3, 0.5))]
    p = progress(counted, trials, [1, 2], True, str)
    # The last improvement came at 20 s; the lines hold to the last counted epoch at 25 s.
    assert p["whole"][-1][0] == 20.0 and p["end"] == 25.0
    svg = charts.progress_chart(p["whole"], p["per_replica"], p["end"])
    assert 'aria-label="best accuracy over time, whole run and per replica"' in svg
    assert "replica 1" in svg and "whole run" in svg
    svg = charts.lineage_chart(p["lineage"], p["siblings"])
    assert "#2" in svg and "D5 Sp" in svg and "other children" in svg
    svg = charts.ranking_chart(p["ranking"].points)
    assert "beat its parent" in svg and "did not" in svg
    # Many replicas share one grey layer; an empty run draws its axes and says why.
    many = {r: [(float(r), 0.5 + r / 1000)] for r in range(100)}
    assert "each of 100 replicas" in charts.progress_chart([(1.0, 0.6)], many)
    assert "no epoch completed" in charts.progress_chart([], {})
    assert "no child with a Gaussian-process prediction" in charts.ranking_chart([])
