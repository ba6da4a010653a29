"""Scoring, by hand: the timeline, sessions, the deadline and every validity rule, under both
ways of charging time (aiperf-2021.1: to the last counted epoch; aiperf-2021.2: each replica
its own time, epochs in flight at the deadline finishing inside the grace)."""

import math
from dataclasses import dataclass

import pytest

from automlperf import rules
from automlperf.measure.score import (MIN_ERROR, NodeCeiling, ceiling_violations,
                                      counted_epochs, implausible, plausible_limit, score_run,
                                      segment_bounds, timeline, violations)

LAST_EPOCH = rules.AIPERF_2021_1
PER_REPLICA = rules.AIPERF_2021_2


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
    started_at: float = 0.0


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
    r = score_run(ev, seg, dataset="builtin", dataset_official=False, fixed_changes=[],
                  ruleset=LAST_EPOCH)
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
    r = score_run(ev, segs, dataset="builtin", dataset_official=False, fixed_changes=[],
                  ruleset=LAST_EPOCH)
    assert r["elapsed_s"] == 600 and r["total_ops"] == 16 and r["epochs_not_counted"] == 2
    assert r["score"] == pytest.approx(16 / 400) and r["best_accuracy"] == 0.3


def test_perfect_accuracy_keeps_the_regulated_score_finite():
    marks = timeline([(10.0, E(1, 0, 0, 100, 1.0))], 10.0)
    assert marks[-1].regulated == pytest.approx(10 * -math.log(MIN_ERROR))


def test_synthetic_data_has_no_accuracy_based_score():
    seg = [S(T0, T0 + 60, T0 + 60, T0 + 60)]
    r = score_run([E(1, 0, T0 + 30, 900, 0.001)], seg, dataset="synthetic",
                  dataset_official=False, fixed_changes=[], accuracy_counts=False,
                  ruleset=LAST_EPOCH)
    assert r["score"] == pytest.approx(30) and r["regulated_score"] is None
    assert r["best_accuracy"] is None


def ep(trial_id, n, start, end, ops, acc=0.5):
    return E(trial_id, n, T0 + end, ops, acc, started_at=T0 + start)


# Two replicas, a 600 s session that reached its deadline, a 100 s grace. Replica 0 (trial 1)
# has an epoch in flight at the deadline that ends at 610 s; replica 1 (trial 2) has one
# that ends at 790 s, past the grace.
TWO = [ep(1, 0, 0, 150, 3), ep(1, 1, 150, 300, 3), ep(1, 2, 300, 450, 3), ep(1, 3, 450, 610, 3, 0.9),
       ep(2, 0, 0, 200, 4), ep(2, 1, 200, 400, 4), ep(2, 2, 400, 590, 4), ep(2, 3, 590, 790, 4, 0.95)]
REPLICA_OF = {1: 0, 2: 1}


def score(ev, segs, ruleset, grace_s=100.0, replica_of=REPLICA_OF):
    return score_run(ev, segs, dataset="builtin", dataset_official=False, fixed_changes=[],
                     ruleset=ruleset, replica_of=replica_of, grace_s=grace_s)


def test_each_replica_is_charged_its_own_time_and_in_flight_epochs_finish_in_the_grace():
    seg = [S(T0, T0 + 600, T0 + 600, T0 + 600)]
    r = score(TWO, seg, PER_REPLICA)
    # Replica 0: 12 ops over 610 s (its last epoch ended in the grace); replica 1: the 12 ops
    # of its epochs that ended by 590 s over the 600 s to the deadline, never less.
    assert r["score"] == pytest.approx(12 / 610 + 12 / 600)
    assert r["total_ops"] == 24 and r["epochs"] == 7 and r["epochs_not_counted"] == 1
    assert r["best_accuracy"] == 0.9  # the epoch past the grace does not count
    assert r["charging"] == {"rule": "per_replica", "grace_s": 100.0,
                             "replica_s": {"0": 610.0, "1": 600.0}}
    assert r["elapsed_s"] == 600  # the run's length, for the duration rule, is the session's
    # At 0.1 h (360 s) each replica's epochs started by then count, charged to their end.
    m1 = r["timeline"][0]
    assert m1["hours"] == 0.1 and m1["ops"] == 17
    assert m1["ops_per_s"] == pytest.approx(9 / 450 + 8 / 400)
    # The same records under aiperf-2021.1: the last counted epoch (590 s) ends the run's
    # time, and replica 0's last 140 s of training are charged without being counted.
    old = score(TWO, seg, LAST_EPOCH)
    assert old["score"] == pytest.approx(21 / 590) and old["charging"]["grace_s"] == 0.0
    assert old["charging"]["rule"] == "last_epoch" and old["charging"]["replica_s"] == {}
    assert r["score"] / old["score"] == pytest.approx((12 / 610 + 12 / 600) / (21 / 590))


def test_from_aiperf_2021_3_the_grace_adds_operations_but_never_accuracy():
    """The epoch that ended in the grace (0.9 at 610 s) counts towards the operations and its
    replica's time, as under aiperf-2021.2, but the best accuracy, and so the regulated score,
    comes only from the epochs that ended by the deadline."""
    seg = [S(T0, T0 + 600, T0 + 600, T0 + 600)]
    before, now = score(TWO, seg, PER_REPLICA), score(TWO, seg, rules.AIPERF_2021_3)
    assert now["score"] == before["score"] and now["charging"] == before["charging"]
    assert before["best_accuracy"] == 0.9 and before["best_trial"] == 1
    assert now["best_accuracy"] == 0.5 and now["timeline"][-1]["best_accuracy"] == 0.5
    assert now["regulated_score"] == pytest.approx(now["score"] * -math.log(0.5))
    assert now["regulated_score"] < before["regulated_score"]


def test_a_replica_that_stopped_early_is_charged_to_the_deadline():
    seg = [S(T0, T0 + 600, T0 + 600, T0 + 600)]
    ev = [ep(1, 0, 0, 100, 5), ep(2, 0, 0, 300, 6), ep(2, 1, 300, 600, 6)]
    r = score(ev, seg, PER_REPLICA)
    assert r["score"] == pytest.approx(5 / 600 + 12 / 600)
    assert r["charging"]["replica_s"] == {"0": 600.0, "1": 600.0}


def test_one_replica_is_charged_to_the_deadline_or_its_last_epoch():
    seg = [S(T0, T0 + 600, T0 + 600, T0 + 600)]
    ev = [ep(1, 0, 0, 250, 10), ep(1, 1, 250, 500, 10), ep(1, 2, 500, 650, 10)]
    assert score(ev, seg, PER_REPLICA)["score"] == pytest.approx(30 / 650)
    assert score(ev, seg, PER_REPLICA, grace_s=0.0)["score"] == pytest.approx(20 / 600)
    assert score(ev, seg, LAST_EPOCH)["score"] == pytest.approx(20 / 500)


def test_no_grace_after_an_interrupted_session():
    # The primary died at 300 s of a 600 s session; resumed, the run reached its deadline.
    segs = [S(T0, T0 + 600, T0 + 300, None), S(T0 + 5000, T0 + 5300, T0 + 5300, T0 + 5300)]
    ev = [ep(1, 0, 0, 200, 5),
          ep(1, 1, 200, 320, 7),          # in flight when the primary died: not counted
          E(2, 0, T0 + 5250, 11, 0.3, started_at=T0 + 5050),
          E(2, 1, T0 + 5340, 13, 0.4, started_at=T0 + 5250)]  # in the final grace: counts
    r = score(ev, segs, PER_REPLICA, replica_of={1: 0, 2: 0})
    assert r["epochs"] == 3 and r["total_ops"] == 29
    # Run time: 300 s in the first session, 300 s in the second; the last epoch ended 40 s
    # after the second's deadline.
    assert r["charging"]["replica_s"] == {"0": 640.0}
    assert r["score"] == pytest.approx(29 / 640)


def rules_(**kw):
    base = dict(dataset="imagenet", dataset_official=True, fixed_changes=[], elapsed_s=3600,
                precisions=["bf16"], error=0.25)
    base.update(kw)
    return violations(**base)


def test_an_official_valid_result():
    assert rules_() == (True, True, [])


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
    is_official, valid, found = rules_(**change)
    assert not valid and is_official == official
    assert [v["rule"] for v in found] == [rule] and found[0]["detail"]


def cpu_node(ceiling, replica=0, **kw):
    return NodeCeiling(replica=replica, host=f"n{replica}", ceiling_ops=ceiling,
                       accelerator=False, **kw)


def gpu_node(ceiling, replica=0, peak=None, **kw):
    return NodeCeiling(replica=replica, host=f"g{replica}", ceiling_ops=ceiling,
                       accelerator=True, peak_ops=peak, **kw)


def test_a_score_far_above_the_measured_ceiling_is_implausible_from_aiperf_2021_3():
    r2021_3 = rules.AIPERF_2021_3
    assert implausible(1.4e12, [cpu_node(1e12)], r2021_3) is None
    wrong = implausible(2e12, [cpu_node(1e12)], r2021_3)
    assert wrong["rule"] == "implausible" and "2.00 times the ceiling" in wrong["detail"]
    assert implausible(2e12, [cpu_node(1e12)], PER_REPLICA) is None  # earlier rulesets never judged it
    # Under 2021.3 a node without a ceiling switched the bound off; its results keep that.
    assert ceiling_violations(9e15, [cpu_node(1e12), cpu_node(None, 1)], r2021_3) == []


def test_no_bound_switches_itself_off_from_aiperf_2021_4():
    """A node without a ceiling makes the result not valid, naming the node; an accelerator
    node's bound is its GEMM's rate at 0.5 (a training step reached 0.23 of it), a CPU's at
    1.5 (training reaches three quarters of its convolution's); a ceiling above its
    accelerators' data sheet is implausible too."""
    (missing,) = ceiling_violations(1e12, [cpu_node(1e12), cpu_node(None, 1, error="the "
                                                                    "measurement failed: boom")])
    assert missing["rule"] == "ceiling"
    assert "replica 1 on n1 (the measurement failed: boom)" in missing["detail"]
    assert ceiling_violations(1e12, [])[0]["rule"] == "ceiling"  # no node described itself
    assert ceiling_violations(1.45e12, [cpu_node(1e12)]) == []
    assert ceiling_violations(0.45e15, [gpu_node(1e15)]) == []
    (over,) = ceiling_violations(0.6e15, [gpu_node(1e15)])
    assert over["rule"] == "implausible" and "at most 0.50 is plausible" in over["detail"]
    # Both kinds: each node's own multiple.
    assert plausible_limit([gpu_node(1e15), cpu_node(1e12, 1)]) == 0.5e15 + 1.5e12
    (peak,) = ceiling_violations(1e14, [gpu_node(1.2e15, peak=989.4e12)])
    assert peak["rule"] == "implausible" and "1.21 times its accelerators' data-sheet peak" \
        in peak["detail"]
    assert ceiling_violations(1e14, [gpu_node(1.05e15, peak=989.4e12)]) == []
