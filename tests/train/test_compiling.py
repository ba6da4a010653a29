"""Compilation where it pays: the rule on given figures, where a rank's figures come from
(given, or kept by the doctor on this node; never measured in the run), the measurement
itself (CPU Inductor), and that a compiled trial counts the same operations
and records per epoch that it ran compiled."""

import json
from dataclasses import replace

import pytest
import torch

from automlperf.config import load_config
from automlperf.train import data as datasets
from automlperf.train import trainer
from automlperf.train import compilecache, compiling
from automlperf.train.compiling import (MARGIN, NO_FIGURES, CompileFigures, decide_compile,
                                        measure_compile)
from automlperf.train.spec import TrialSpec
from automlperf.train.trainer import RankContext, train_on_rank
from helpers import data_section, trial_spec
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


def test_where_the_deadline_cuts_the_training_the_work_done_before_it_decides():
    # 1e15 operations: 1,000 s eager, 697 s compiled (30 s of it compiling); pays unbounded.
    assert decide_compile(None, 1e15, 100, FIGURES, time_left_s=2000).compile  # both finish
    # 400 s left: 4e14 done eager against (400 - 30) * 1.5e12 = 5.55e14 compiled.
    cut = decide_compile(None, 1e15, 100, FIGURES, time_left_s=400)
    assert cut.compile and "the deadline, 400 s away, leaves 40 % of it done eager against " \
        "56 % compiled" in cut.reason
    # 60 s left: 6e13 eager against 4.5e13 compiled: the compilation eats the time.
    assert not decide_compile(None, 1e15, 100, FIGURES, time_left_s=60).compile
    # 2e14 operations in 210 s: both finish (200 s eager, 163 s compiled): the usual rule.
    assert decide_compile(None, 2e14, 100, FIGURES, time_left_s=210).compile
    # 150 s left: 1.5e14 eager against 1.8e14 compiled: compiling pays.
    assert decide_compile(None, 2e14, 100, FIGURES, time_left_s=150).compile
    # 100 s left: 1e14 eager against 1.05e14 compiled: within the margin, eager stays.
    assert not decide_compile(None, 2e14, 100, FIGURES, time_left_s=100).compile
    # Past the deadline (a trial started in the grace): nothing is done either way.
    assert not decide_compile(None, 1e15, 100, FIGURES, time_left_s=-5).compile
    # A setting decides whatever the deadline.
    assert decide_compile(True, 1e15, 100, FIGURES, time_left_s=1).compile


def test_the_compilation_cost_grows_with_the_layers_and_settings_win():
    ops = 2e14  # 200 s eager; compiled: 133 s + the compilation
    assert decide_compile(None, ops, 100, FIGURES).compile  # 30 s: 163 s
    grown = decide_compile(None, ops, 300, FIGURES)  # 90 s: 223 s
    assert not grown.compile and grown.compiled_s == pytest.approx(90 + ops / 1.5e12)
    assert decide_compile(True, 1.0, 100, None).compile  # the setting decides
    assert not decide_compile(False, 1e18, 100, FIGURES).compile
    none = decide_compile(None, 1e18, 100, None)
    assert not none.compile and none.reason == NO_FIGURES
    assert none.reason.startswith("no measured compilation figures: automlperf doctor")
    slower = CompileFigures(30.0, 100, 1e12, 0.9e12)  # compiled steps slower: never
    assert not decide_compile(None, 1e18, 100, slower).compile


def test_a_loader_slower_than_the_steps_caps_both_ways_and_compiling_gains_nothing():
    # 1e15 operations on 1e6 images: 1e9 operations an image; steps of 1,000 img/s eager
    # and 1,500 compiled. Unbounded, compiling pays (1,000 s against 697 s).
    fed = replace(FIGURES, loader_images_per_s=5_000.0)  # faster than both: no change
    assert decide_compile(None, 1e15, 100, fed, planned_images=1e6) == \
        replace(decide_compile(None, 1e15, 100, FIGURES), figures=fed)
    # A loader of 1,200 img/s: compiled steps wait for it (833 s + 30 s against 1,000 s).
    mid = decide_compile(None, 1e15, 100, replace(FIGURES, loader_images_per_s=1_200.0),
                         planned_images=1e6)
    assert mid.compile and mid.compiled_s == pytest.approx(30 + 1e15 / 1.2e12)
    assert "the loader's 1,200 img/s caps the steps at 1.2e+12 ops/s" in mid.reason
    # A loader of 900 img/s: both ways train at its rate, and the compilation is lost time.
    slow = decide_compile(None, 1e15, 100, replace(FIGURES, loader_images_per_s=900.0),
                          planned_images=1e6)
    assert not slow.compile and slow.eager_s == pytest.approx(1e15 / 0.9e12)
    assert slow.compiled_s == pytest.approx(30 + 1e15 / 0.9e12)
    # Without the trial's images the cap cannot be applied: the rates alone decide.
    assert decide_compile(None, 1e15, 100, replace(FIGURES, loader_images_per_s=900.0)).compile


def test_the_doctors_loader_rate_is_given_to_the_figures_of_its_device(tmp_path):
    path = tmp_path / "figures.json"
    assert compilecache.note_loader_rate(CPU, 750.0, path) == 0  # nothing kept yet
    mine = compilecache.key_for(CPU, "fp32", True, 64)
    compilecache.save_figures(mine, FIGURES, path)
    compilecache.save_figures(replace(mine, batch=32, channels_last=False), FIGURES, path)
    compilecache.save_figures(replace(mine, device="NVIDIA H200"), FIGURES, path)
    assert compilecache.note_loader_rate(CPU, 750.0, path) == 2
    assert compilecache.cached_figures(mine, path).loader_images_per_s == 750.0
    assert compilecache.cached_figures(replace(mine, device="NVIDIA H200"),
                                       path).loader_images_per_s is None
    cfg = load_config(None, "digits", {"train": {"compile_figures": {
        **FIGURES.to_dict(), "loader_images_per_s": 750.0}}})
    assert cfg.train.compile_figures.loader_images_per_s == 750.0


def test_figures_round_trip_through_the_configuration_and_the_spec():
    cfg = load_config(None, "digits", {"train": {"compile_figures": FIGURES.to_dict()}})
    assert cfg.train.compile is None  # the default: decided
    spec = TrialSpec.from_config(cfg.train, "kaiming_normal", trial_id=1, graph=TINY.to_dict(),
                                 epochs=1, batch_size=8, patience=1)
    assert CompileFigures.from_dict(spec.compile_figures) == FIGURES
    assert TrialSpec.from_dict(spec.to_dict()) == spec


def _run(spec, ctx):
    return trainer._Run(spec, ctx, trainer.Graph.from_dict(spec.graph))


def test_a_rank_without_figures_stays_eager_and_measures_nothing(monkeypatch):
    def no(*args, **kw):
        raise AssertionError("a rank must not measure compilation inside the run's clock")

    monkeypatch.setattr(compiling, "measure_compile", no)
    assert not hasattr(trainer, "measure_compile")
    ctx = RankContext(0, 1, CPU, datasets.load(data_section("digits")))
    run = _run(trial_spec("t", graph=TINY, epochs=100), ctx)
    assert not run.compiled and run.decision.reason == NO_FIGURES
    assert not compilecache.cache_path().exists()  # nothing measured, nothing kept
    assert run.decision.to_dict()["figures"] is None
    # Given figures decide: 100 epochs of the digits repay a tiny compilation.
    cheap = CompileFigures(0.5, len(TINY), 1e9, 2e9).to_dict()
    run = _run(trial_spec("t", graph=TINY, epochs=100, compile=None, compile_figures=cheap), ctx)
    assert run.compiled and run.decision.planned_ops > 0
    run = _run(trial_spec("t", graph=TINY, epochs=1, compile=None,
                          compile_figures={**cheap, "compile_s": 1e4}), ctx)
    assert not run.compiled
    # The same 100 epochs with the run's deadline a second away: the compilation would eat it.
    import time

    run = _run(trial_spec("t", graph=TINY, epochs=100, compile=None, compile_figures=cheap,
                          finish_by=time.time() + 1.0), ctx)
    assert not run.compiled and "the deadline, " in run.decision.reason


def _doctor_node(tmp_path):
    """A doctor's node on this CPU whose train items measured a cheap compilation of TINY."""
    from automlperf.runner import doctor
    from automlperf.runner.doctor.common import DoctorRequest

    node = doctor.Node(DoctorRequest(tmp_path))
    node.step_ops = {"train channels_last": 1e9, "train eager": 1e9, "train compiled": 2e9}
    node.first_overheads = {"train channels_last": 1.0, "train eager": 1.0,
                            "train compiled": 1.5}
    return node


def test_the_doctors_figures_are_kept_and_decide_the_ranks_on_that_node_alone(tmp_path):
    from automlperf.runner.doctor import training

    node = _doctor_node(tmp_path)
    figures = training.compile_figures(node, len(TINY))
    # The doctor's compiled item trained fp32 at 64 images a rank (the trials' default here).
    kept = training.keep_figures(node, figures, "fp32", 64)
    assert kept == str(compilecache.cache_path())
    assert "kept in " + kept in training.compile_advice(
        node, figures, training.Shape("resnet50", 224, 1000, True), kept)
    ctx = RankContext(0, 1, CPU, datasets.load(data_section("digits")))
    run = _run(trial_spec("t", graph=TINY, epochs=100), ctx)
    assert run.compiled and "repays itself" in run.decision.reason
    source = run.decision.figures.source
    assert source == f"automlperf doctor, {node.devices[0]} (cached in {kept})"
    assert run.decision.to_dict()["figures"]["compile_s"] == figures.compile_s
    # Another batch takes the nearest kept one, and says so.
    other = _run(trial_spec("t", graph=TINY, epochs=100, batch_size=32), ctx)
    assert other.compiled and other.decision.figures.source.endswith(", at batch 64)")
    # The loader's rate alone, which the doctor's input-pipeline item adds, caps both ways: a
    # loader slower than the eager steps leaves compiling nothing to gain.
    assert compilecache.note_loader_rate(CPU, 1e-3) == 1
    capped = _run(trial_spec("t", graph=TINY, epochs=100), ctx)
    assert not capped.compiled and "caps the steps" in capped.decision.reason
    # Figures of another precision, layout, device or torch never decide.
    key = compilecache.key_for(CPU, "fp32", True, 64)
    for changed in ({"precision": "bf16"}, {"channels_last": False}, {"device": "NVIDIA H200"},
                    {"torch": "0.0.1"}):
        assert compilecache.cached_figures(replace(key, **changed)) is None
    compilecache.cache_path().unlink()
    assert compilecache.save_figures(replace(key, torch="0.0.1"), figures)
    assert not _run(trial_spec("t", graph=TINY, epochs=100), ctx).compiled


def test_the_cache_keeps_one_entry_per_key_and_ignores_what_it_cannot_read(tmp_path):
    path = tmp_path / "figures.json"
    key = compilecache.FiguresKey("NVIDIA H200", "2.11.0+cu130", "bf16", True, 256)
    assert compilecache.cached_figures(key, path) is None  # no file
    path.write_text("{not json")
    assert compilecache.cached_figures(key, path) is None
    compilecache.save_figures(key, FIGURES, path)
    compilecache.save_figures(key, CompileFigures(65.0, 100, 1e12, 1.01e12, "doctor"), path)
    compilecache.save_figures(compilecache.FiguresKey("NVIDIA H200", "2.11.0+cu130", "bf16",
                                                      True, 128), FIGURES, path)
    got = compilecache.cached_figures(key, path)
    assert (got.compile_s, got.compiled_ops_per_s) == (65.0, 1.01e12)
    assert got.source == f"doctor (cached in {path})"
    assert len(json.loads(path.read_text())["entries"]) == 2
    # 65 s for steps 1 % faster does not repay a first-round trial's hour: eager.
    assert not decide_compile(None, 3.6e15, 100, got).compile
    # Figures of an earlier format (a second graph's compilation in their cost) are not used.
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format": 1}))
    assert compilecache.cached_figures(key, path) is None


@pytest.mark.slow
def test_the_measurement_times_both_rates_and_the_compilation():
    from automlperf.train.evaluate import precision_context

    figures = measure_compile(TINY, 32, CPU, precision_context("fp32", CPU), torch.channels_last,
                              steps=2)
    assert figures.compile_s > 0 and figures.layers == len(TINY)
    assert figures.eager_ops_per_s > 0 and figures.compiled_ops_per_s > 0


@pytest.mark.slow
def test_a_compiled_trial_counts_the_same_operations_and_says_it_ran_compiled():
    ctx = RankContext(0, 1, CPU, datasets.load(data_section("digits")))
    events = {}
    outcomes = {}
    for compile in (False, True):
        got = []
        outcomes[compile] = train_on_rank(
            trial_spec(str(compile), graph=TINY, epochs=2, batch_size=256, compile=compile), ctx,
            emit=lambda kind, payload, got=got: got.append(payload) if kind == "epoch" else None)
        events[compile] = got
    # One step an epoch, of 1,437 images at a per-rank batch of 2,048: that batch compiles.
    got = []
    outcomes["one step"] = train_on_rank(
        trial_spec("one", graph=TINY, epochs=2, batch_size=2048, compile=True), ctx,
        emit=lambda kind, payload: got.append(payload) if kind == "epoch" else None)
    events["one step"] = got
    for compile, outcome in outcomes.items():
        assert outcome.status == "completed", outcome.reason
        assert outcome.extra["compile_decision"]["compile"] is bool(compile)
        assert [e["compiled"] for e in events[compile]] == [bool(compile)] * 2
    # 1,437 training images in batches of 256: the short last batch of each epoch ran
    # eagerly instead of compiling a second graph (torch before 2.6 compiles one for it).
    one_graph = hasattr(torch.compiler, "set_stance")
    assert outcomes[True].extra["compiled_graphs"] == (1 if one_graph else 2)
    assert outcomes["one step"].extra["compiled_graphs"] == 1
    assert "compile_fallback" not in outcomes["one step"].extra
    assert [e["steps"] for e in events["one step"]] == [1, 1]
    for eager, compiled in zip(events[False], events[True]):
        assert (eager["ops"], eager["train_images"], eager["val_images"], eager["steps"]) == (
            compiled["ops"], compiled["train_images"], compiled["val_images"], compiled["steps"])


def test_a_batch_of_another_size_runs_eagerly_under_the_eager_stance():
    from automlperf.train.builder import build_module

    if not hasattr(torch.compiler, "set_stance"):
        pytest.skip("torch before 2.6 has no compiler stances")
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    module = build_module(TINY, seed=0)
    runner = compiling.compile_module(module, backend=backend)
    shape = TINY.input_shape
    x = torch.randn(3, *shape)
    runner(torch.randn(8, *shape))
    with compiling.eager_stance():
        short = runner(x)
    runner(torch.randn(8, *shape))
    assert len(seen) == 1  # the full batches' graph only, reused after the eager batch
    assert torch.equal(short, module(x))


def test_without_the_eager_stance_each_batch_size_gets_a_static_graph_of_its_own():
    # Left dynamic, the second batch size would hand the backend a graph whose batch is a
    # symbol, which Dynamo then tries first for the full batches too (slower on a GPU).
    from automlperf.train.builder import build_module

    seen = []

    def backend(gm, example_inputs):
        seen.append([tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                     for x in example_inputs])
        return gm.forward

    runner = compiling.compile_module(build_module(TINY, seed=0), backend=backend)
    shape = TINY.input_shape
    for batch in (8, 3, 8, 3):
        runner(torch.randn(batch, *shape))
    assert len(seen) == 2, seen  # one graph per batch size, each reused
    images = [[s[0] for s in shapes if isinstance(s, tuple) and s[1:] == tuple(shape)]
              for shapes in seen]
    assert images == [[8], [3]], seen
    assert all(isinstance(s, tuple) for shapes in seen for s in shapes), seen  # no symbolic size
