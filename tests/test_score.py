"""Scoring, by hand: the timeline, sessions, the deadline and every validity rule."""

import math
from dataclasses import dataclass

import pytest

from automlperf.measure.score import (MIN_ERROR, counted_epochs, score_run, segment_bounds,
                                      timeline, violations)


@dataclass
class E:
    trial_id: int
    epoch: int
    ended_at: float
    ops: int
    val_accuracy: float
    train_images: int = 100
    val_images: int = 10
    precision: str = "bf16"
    skipped_images: int = 0
    val_skipped: int = 0


@dataclass
class S:
    started_at: float
    deadline_at: float
    last_seen: float
    ended_at: float | None = None


T0 = 1_000_000.0


def test_score_from_hand_made_events():
    # One session of 0.25 h; epochs end at 100 s, 400 s, 500 s and 800 s of run time.
    seg = [S(T0, T0 + 900, T0 + 900, T0 + 900)]
    ev = [E(1, 0, T0 + 100, 10**12, 0.40), E(1, 1, T0 + 400, 2 * 10**12, 0.55),
          E(2, 0, T0 + 500, 3 * 10**12, 0.50), E(2, 1, T0 + 800, 4 * 10**12, 0.80)]
    r = score_run(ev, seg, dataset="builtin", dataset_official=False, fixed_changes=[])
    hours = [m["hours"] for m in r["timeline"]]
    assert hours == [0.1, 0.2, 0.25]
    m1, m2, m3 = r["timeline"]
    # 0.1 h = 360 s: only the first epoch; OPS divides by the time of the last epoch (100 s).
    assert m1["ops"] == 10**12 and m1["ops_per_s"] == pytest.approx(10**12 / 100)
    assert m1["regulated"] == pytest.approx(10**10 * -math.log(0.6))
    # 0.2 h = 720 s: three epochs, last at 500 s, best 0.55.
    assert m2["ops"] == 6 * 10**12 and m2["ops_per_s"] == pytest.approx(6 * 10**12 / 500)
    assert m2["best_accuracy"] == 0.55
    # End (900 s): all four, last at 800 s, best 0.80.
    assert m3["ops_per_s"] == pytest.approx(10**13 / 800)
    assert r["score"] == pytest.approx(1.25e10)
    assert r["regulated_score"] == pytest.approx(1.25e10 * -math.log(0.2))
    assert r["best_accuracy"] == 0.8 and r["error"] == pytest.approx(0.2)
    assert r["total_ops"] == 10**13 and r["best_trial"] == 2 and r["elapsed_s"] == 900
    assert (r["train_images"], r["val_images"], r["epochs"]) == (400, 40, 4)


def test_work_after_the_deadline_and_between_sessions_does_not_count():
    segs = [S(T0, T0 + 600, T0 + 300, None),           # primary died at 300 s
            S(T0 + 5000, T0 + 5300, T0 + 5400, T0 + 5400)]  # resumed for the remaining 300 s
    assert segment_bounds(segs) == [(T0, T0 + 300, 0.0), (T0 + 5000, T0 + 5300, 300.0)]
    ev = [E(1, 0, T0 + 200, 5, 0.1),      # run time 200
          E(1, 1, T0 + 1000, 7, 0.9),     # while the run was down: not counted
          E(2, 0, T0 + 5100, 11, 0.3),    # run time 400
          E(2, 1, T0 + 5350, 13, 0.95)]   # after the deadline: not counted
    counted = counted_epochs(ev, segs)
    assert [(t, e.ops) for t, e in counted] == [(200, 5), (400, 11)]
    r = score_run(ev, segs, dataset="builtin", dataset_official=False, fixed_changes=[])
    assert r["elapsed_s"] == 600 and r["total_ops"] == 16 and r["epochs_not_counted"] == 2
    assert r["score"] == pytest.approx(16 / 400) and r["best_accuracy"] == 0.3


def test_perfect_accuracy_keeps_the_regulated_score_finite():
    marks = timeline([(10.0, E(1, 0, 0, 100, 1.0))], 10.0)
    assert marks[-1].regulated == pytest.approx(10 * -math.log(MIN_ERROR))


def test_synthetic_data_has_no_accuracy_based_score():
    seg = [S(T0, T0 + 60, T0 + 60, T0 + 60)]
    r = score_run([E(1, 0, T0 + 30, 900, 0.001)], seg, dataset="synthetic",
                  dataset_official=False, fixed_changes=[], accuracy_counts=False)
    assert r["score"] == pytest.approx(30) and r["regulated_score"] is None
    assert r["best_accuracy"] is None


def rules(**kw):
    base = dict(dataset="imagenet", dataset_official=True, fixed_changes=[], elapsed_s=3600,
                precisions=["bf16"], error=0.25)
    base.update(kw)
    return violations(**base)


def test_an_official_valid_result():
    assert rules() == (True, True, [])


@pytest.mark.parametrize("change,rule,official", [
    (dict(dataset="cifar10", dataset_official=False), "dataset", False),
    (dict(dataset_official=False), "dataset", False),  # imagenet folders, but not 1000 classes
    (dict(fixed_changes=["data.image_size = 160 (official: 224)"]), "fixed_setting", False),
    (dict(elapsed_s=3599), "duration", True),
    (dict(precisions=["bf16", "fp8"]), "precision", True),
    (dict(error=0.31), "max_error", True),
    (dict(error=None), "max_error", True),
])
def test_each_rule_is_checked_and_named(change, rule, official):
    is_official, valid, found = rules(**change)
    assert not valid and is_official == official
    assert [v["rule"] for v in found] == [rule] and found[0]["detail"]
