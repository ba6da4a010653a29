"""The learning rate of a warm-up round decays over the maximum epoch budget, not its own."""

import torch

from automlperf.config import Config
from automlperf.graph import Graph, seeds
from automlperf.train import data
from automlperf.train.trainer import RankContext, TrialSpec, _Run
from helpers import data_section


def schedule(epochs, horizon):
    ds = data.load(data_section("builtin", image_size=8))
    graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=1)
    spec = TrialSpec("t", graph.to_dict(), epochs=epochs, batch_size=64, patience=5,
                     warmup_epochs=1.0, horizon_epochs=horizon)
    run = _Run(spec, RankContext(0, 1, torch.device("cpu"), ds), Graph.from_dict(spec.graph))
    return run.steps_per_epoch, run.schedule.lr_lambdas[0]


def test_a_warm_up_round_decays_over_max_epochs():
    cfg = Config.for_dataset("builtin")
    epochs, horizon = cfg.train.round_epochs(0), cfg.train.max_epochs
    assert epochs < horizon
    steps, factor = schedule(epochs, horizon)
    end = epochs * steps
    # At the end of the round the rate is where a full trial's would be, not 0.
    expected = (horizon * steps - end) / (horizon * steps - steps)
    assert abs(factor(end - 1) - expected) < 2 / steps and factor(end - 1) > 0.5
    assert factor(horizon * steps) == 0.0


def test_without_a_horizon_a_trial_decays_over_its_own_epochs():
    steps, factor = schedule(2, None)
    assert factor(2 * steps) == 0.0 and factor(2 * steps - 1) > 0
