"""What one trial leaves to the next in a long-lived rank: the allocator and compile-thread
settings a rank starts with, memory given back after each trial, and torch.compile working
afresh for every trial (CPU Inductor)."""

import gc

import pytest
import torch
from torch import nn

from automlperf.graph.graph import INPUT, Graph, conv, dense, simple
from automlperf.train import data as datasets
from automlperf.train.data import folders
from automlperf.train.rankenv import (ALLOC_DEFAULT, COMPILE_THREADS_VAR, INDUCTOR_CACHE_VAR,
                                      compile_threads, set_rank_environment)
from automlperf.train.trainer import RankContext, train_on_rank
from helpers import TEST_MAX_UNREADABLE, data_section, trial_spec

CPU = torch.device("cpu")
# The smallest graph with every kind of layer a trial compiles: Inductor builds it in seconds.
TINY = Graph.build((1, 8, 8), [conv("c", INPUT, 4, 3, 1, padding=1),
                               simple("bn", "batchnorm", "c"), simple("relu", "relu", "bn"),
                               simple("pool", "global_avgpool", "relu"),
                               dense("fc", "pool", 10), simple("softmax", "softmax", "fc")])


def test_rank_environment_sets_defaults_and_keeps_the_users(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env: dict[str, str] = {}
    # Compiled graphs beside the compile figures, where the next job finds them.
    assert set_rank_environment(8, 6, env) == {"PYTORCH_CUDA_ALLOC_CONF": ALLOC_DEFAULT,
                                               COMPILE_THREADS_VAR: "2",
                                               INDUCTOR_CACHE_VAR: str(tmp_path / "automlperf"
                                                                       / "inductor")}
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        env = {name: "max_split_size_mb:128", COMPILE_THREADS_VAR: "3", INDUCTOR_CACHE_VAR: "/c"}
        assert set_rank_environment(8, 6, env) == {}
        assert env == {name: "max_split_size_mb:128", COMPILE_THREADS_VAR: "3",
                       INDUCTOR_CACHE_VAR: "/c"}
    # Compile workers take the cores the decoding workers leave, never none.
    assert compile_threads(8, 7) == 1 and compile_threads(2, 5) == 1 and compile_threads(16, 0) == 16


def _live(kind: type) -> int:
    return sum(issubclass(type(o), kind) for o in gc.get_objects())


@pytest.mark.slow
def test_a_trial_leaves_no_module_optimiser_or_loader_behind(tmp_path):
    """With the collector off, only the rank's own collection between trials frees what
    reference cycles hold (the optimiser and its schedule, a failed trial's traceback)."""
    from imagefolder import make_image_folder

    make_image_folder(tmp_path, classes=2, train_per_class=6, val_per_class=2, corrupt=1)
    folder = datasets.load(data_section("imagenet", data_dir=tmp_path, image_size=8, workers=1,
                                        max_unreadable=TEST_MAX_UNREADABLE))
    graph = Graph.build((3, 8, 8), [conv("c", INPUT, 4, 3, 1, padding=1),
                                    simple("pool", "global_avgpool", "c"),
                                    dense("fc", "pool", 2), simple("softmax", "softmax", "fc")])
    ctx = RankContext(0, 1, CPU, folder)
    gc.collect()
    before = (_live(nn.Module), _live(torch.optim.Optimizer), _live(folders._FolderLoader))
    gc.disable()
    try:
        done = train_on_rank(trial_spec("ok", graph=graph, batch_size=4), ctx)
        failed = train_on_rank(trial_spec("nan", graph=graph, epochs=3, batch_size=4,
                                          lr_per_256=1e9), ctx)
        after = (_live(nn.Module), _live(torch.optim.Optimizer), _live(folders._FolderLoader))
    finally:
        gc.enable()
    assert done.status == "completed", done.reason
    assert failed.status == "failed"
    assert after == before
    assert folder._loader is None  # its decoding workers and buffers went with it


@pytest.mark.slow
def test_every_trial_in_a_rank_is_compiled_not_run_eagerly(monkeypatch):
    """Two trials in one rank with Dynamo allowed a single compilation per code object: both
    are compiled (each trial starts from a clean cache), with the compile threads the rank
    asked for."""
    import torch._dynamo
    import torch._inductor.config

    monkeypatch.setenv(COMPILE_THREADS_VAR, "1")
    ctx = RankContext(0, 1, CPU, datasets.load(data_section("digits")))
    with torch._dynamo.config.patch(recompile_limit=1):
        for trial in ("first", "second"):
            out = train_on_rank(trial_spec(trial, graph=TINY, batch_size=256, compile=True), ctx)
            assert out.status == "completed", out.reason
            assert out.extra["compiled_graphs"] >= 1 and "compile_fallback" not in out.extra
    assert torch._inductor.config.compile_threads == 1


@pytest.mark.slow
def test_a_trial_that_runs_eagerly_says_so():
    """When Dynamo gives up on the model (here: no compilation allowed at all), the trial
    still trains, and its outcome records that it ran eagerly."""
    import torch._dynamo

    ctx = RankContext(0, 1, CPU, datasets.load(data_section("digits")))
    with torch._dynamo.config.patch(recompile_limit=0):
        out = train_on_rank(trial_spec("eager", graph=TINY, batch_size=256, compile=True), ctx)
    assert out.status == "completed", out.reason
    assert out.extra["compiled_graphs"] == 0
    assert out.extra["compile_fallback"].startswith("eager:")
