"""The early-stopping rule, by hand: a flat validation loss with a minimum change (the
paper's rule, with its reference's min_delta), and the accuracy rule it replaced."""

import math

import pytest

from automlperf.config import Config
from automlperf.train.spec import EarlyStopping, TrialSpec


def stops(rule: EarlyStopping, losses=None, accuracies=None) -> int | None:
    """The epoch after which ``rule`` stops, or None."""
    n = len(losses or accuracies)
    for epoch in range(n):
        loss = losses[epoch] if losses else None
        acc = accuracies[epoch] if accuracies else 0.0
        if rule.update(loss, acc):
            return epoch
    return None


def test_a_loss_that_falls_by_less_than_min_delta_is_flat():
    # From epoch 1 it falls, but never by 0.001 below its best (1.5) in three epochs.
    losses = [2.0, 1.5, 1.4996, 1.4993, 1.4991, 1.2]
    assert stops(EarlyStopping("val_loss", patience=3, min_delta=0.001), losses) == 4
    # Without a minimum change the same losses improve every epoch.
    assert stops(EarlyStopping("val_loss", patience=3, min_delta=0.0), losses) is None


def test_flat_epochs_are_counted_from_the_best_loss_not_the_last():
    # 1.0 is the best; 0.9995 is not 0.001 below it, so it does not reset the count even
    # though it is lower; 0.998 is.
    rule = EarlyStopping("val_loss", patience=2, min_delta=0.001)
    assert not rule.update(1.0, 0.1)
    assert not rule.update(0.9995, 0.1)  # 1 flat epoch
    assert not rule.update(0.998, 0.1)   # improved by more than 0.001 on 1.0: reset
    assert rule.best == 0.998 and rule.stale == 0
    assert not rule.update(1.2, 0.9)     # worse, whatever the accuracy does
    assert rule.update(0.9975, 0.95)     # 0.0005 below the best: flat, second in a row


def test_a_missing_or_non_finite_loss_never_improves():
    rule = EarlyStopping("val_loss", patience=2, min_delta=0.001)
    assert not rule.update(1.0, 0.5)
    assert not rule.update(None, 0.6)
    assert rule.update(math.nan, 0.7)


def test_the_accuracy_rule_stops_on_strict_non_improvement():
    accuracies = [0.5, 0.6, 0.6, 0.59, 0.7]
    assert stops(EarlyStopping("val_accuracy", patience=2), accuracies=accuracies) == 3
    assert stops(EarlyStopping("val_accuracy", patience=3), accuracies=accuracies) is None


def test_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="val_loss or val_accuracy"):
        EarlyStopping("train_loss", patience=2)


def test_the_configured_rule_reaches_the_trial_spec():
    config = Config.for_dataset("builtin", {"train": {"early_stop_metric": "val_loss",
                                                       "early_stop_min_delta": 0.01}})
    spec = TrialSpec.from_config(config.train, "kaiming_normal", trial_id=1, graph={},
                                 epochs=3, batch_size=64, patience=2)
    assert (spec.early_stop_metric, spec.early_stop_min_delta) == ("val_loss", 0.01)
    assert TrialSpec.from_dict(spec.to_dict()) == spec
