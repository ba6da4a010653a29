"""Compilation where it pays: the rule on given figures, where a rank's figures come from,
the measurement itself (CPU Inductor), and that a compiled trial counts the same operations
and records per epoch that it ran compiled."""

import pytest
import torch

from automlperf.config import load_config
from automlperf.train import data as datasets
from automlperf.train import trainer
from automlperf.train.compiling import MARGIN, CompileFigures, decide_compile, measure_compile
from automlperf.train.spec import TrialSpec
from automlperf.train.trainer import RankContext, train_on_rank
from helpers import trial_spec
from test_rank_state import TINY

CPU = torch.device("cpu")
# 30 s to compile a 100-layer model; steps 1.5x faster compiled: 1e12 OPS eager, 1.5e12 compiled.
FIGURES = CompileFigures(compile_s=30.0, layers=100, eager_ops_per_s=1e12,
                         compiled_ops_per_s=1.5e12, source="given")


def test_compilation_pays_only_when_the_planned_training_repays_it():
    # Break-even: ops/1e12 = 30 + ops/1.5e12, so ops = 9e13 (90 s eager against 90 s compiled).
    long = decide_compile(None, 1e15, 100, FIGURES)
    assert long.compile and long.eager_s == pytest.approx(1000) and long.compiled_s == pytest.approx(30 + 1000 / 1.5)
    assert "repays itself" in long.reason
    assert not decide_compile(None, 9e13, 100, FIGURES).compile  # no gain at break-even
    # A saving inside the margin is noise: eager stays. Compiled wins from 30 s / (0.95 - 1/1.5).
    least = 30 / (1 - MARGIN - 1 / 1.5) * 1e12
    assert not decide_compile(None, 0.98 * least, 100, FIGURES).compile
    assert decide_compile(None, 1.02 * least, 100, FIGURES).compile
    short = decide_compile(None, 1e13, 100, FIGURES)
    assert not short.compile and "does not repay" in short.reason


def test_the_compilation_cost_grows_with_the_layers_and_settings_win():
    ops = 2e14  # 200 s eager; compiled: 133 s + the compilation
    assert decide_compile(None, ops, 100, FIGURES).compile  # 30 s: 163 s
    grown = decide_compile(None, ops, 300, FIGURES)  # 90 s: 223 s
    assert not grown.compile and grown.compiled_s == pytest.approx(90 + ops / 1.5e12)
    assert decide_compile(True, 1.0, 100, None).compile  # the setting decides
    assert not decide_compile(False, 1e18, 100, FIGURES).compile
    none = decide_compile(None, 1e18, 100, None)
    assert not none.compile and none.reason == "no measured compilation figures"
    slower = CompileFigures(30.0, 100, 1e12, 0.9e12)  # compiled steps slower: never
    assert not decide_compile(None, 1e18, 100, slower).compile


def test_figures_round_trip_through_the_configuration_and_the_spec():
    cfg = load_config(None, "digits", {"train": {"compile_figures": FIGURES.to_dict()}})
    assert cfg.train.compile is None  # the default: decided
    spec = TrialSpec.from_config(cfg.train, "kaiming_normal", trial_id=1, graph=TINY.to_dict(),
                                 epochs=1, batch_size=8, patience=1)
    assert CompileFigures.from_dict(spec.compile_figures) == FIGURES
    assert TrialSpec.from_dict(spec.to_dict()) == spec


def _run(spec, ctx):
    return trainer._Run(spec, ctx, trainer.Graph.from_dict(spec.graph))


def test_a_cpu_rank_without_figures_stays_eager_and_measures_nothing(monkeypatch):
    def no(*args, **kw):
        raise AssertionError("a CPU rank must not measure compilation by default")

    monkeypatch.setattr(trainer, "measure_compile", no)
    ctx = RankContext(0, 1, CPU, datasets.load("digits"))
    run = _run(trial_spec("t", graph=TINY, epochs=100), ctx)
    assert not run.compiled and run.decision.reason == "no measured compilation figures"
    # Given figures decide on a CPU too: 100 epochs of the digits repay a tiny compilation.
    cheap = CompileFigures(0.5, len(TINY), 1e9, 2e9).to_dict()
    run = _run(trial_spec("t", graph=TINY, epochs=100, compile=None, compile_figures=cheap), ctx)
    assert run.compiled and run.decision.planned_ops > 0
    run = _run(trial_spec("t", graph=TINY, epochs=1, compile=None,
                          compile_figures={**cheap, "compile_s": 1e4}), ctx)
    assert not run.compiled


def test_an_accelerator_rank_measures_once_and_keeps_the_figures(monkeypatch):
    calls = []

    def measured(graph, per_rank, device, autocast, memory_format):
        calls.append(per_rank)
        return CompileFigures(1.0, len(graph), 1e7, 2e7, "stub")

    monkeypatch.setattr(trainer, "measures_compile", lambda device: True)
    monkeypatch.setattr(trainer, "measure_compile", measured)
    ctx = RankContext(0, 1, CPU, datasets.load("digits"))
    first = _run(trial_spec("a", graph=TINY, epochs=50, compile=None), ctx)
    second = _run(trial_spec("b", graph=TINY, epochs=50, compile=None), ctx)
    assert calls == [64] and first.compiled and second.compiled
    assert ctx.compile_figures == CompileFigures(1.0, len(TINY), 1e7, 2e7, "stub")
    assert not _run(trial_spec("c", graph=TINY, epochs=50, compile=False), ctx).compiled

    def broken(*args):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(trainer, "measure_compile", broken)
    ctx = RankContext(0, 1, CPU, datasets.load("digits"))
    failed = _run(trial_spec("d", graph=TINY, epochs=50, compile=None), ctx)
    assert not failed.compiled and failed.decision.reason == "measuring compilation failed"
    assert ctx.compile_figures == "failed"  # not measured again for every trial


@pytest.mark.slow
def test_the_measurement_times_both_rates_and_the_compilation():
    from automlperf.train.evaluate import precision_context

    figures = measure_compile(TINY, 32, CPU, precision_context("fp32", CPU), torch.channels_last,
                              steps=2)
    assert figures.compile_s > 0 and figures.layers == len(TINY)
    assert figures.eager_ops_per_s > 0 and figures.compiled_ops_per_s > 0


@pytest.mark.slow
def test_a_compiled_trial_counts_the_same_operations_and_says_it_ran_compiled():
    ctx = RankContext(0, 1, CPU, datasets.load("digits"))
    events = {}
    outcomes = {}
    for compile in (False, True):
        got = []
        outcomes[compile] = train_on_rank(
            trial_spec(str(compile), graph=TINY, epochs=2, batch_size=256, compile=compile), ctx,
            emit=lambda kind, payload, got=got: got.append(payload) if kind == "epoch" else None)
        events[compile] = got
    for compile, outcome in outcomes.items():
        assert outcome.status == "completed", outcome.reason
        assert outcome.extra["compile_decision"]["compile"] is compile
        assert [e["compiled"] for e in events[compile]] == [compile, compile]
    for eager, compiled in zip(events[False], events[True]):
        assert (eager["ops"], eager["train_images"], eager["val_images"], eager["steps"]) == (
            compiled["ops"], compiled["train_images"], compiled["val_images"], compiled["steps"])
