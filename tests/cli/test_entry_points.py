"""The library functions behind `automlperf run` and `automlperf train`, called in-process."""

import json

import pytest
from rich.console import Console

from automlperf.config import Config
from automlperf.errors import UserError
from automlperf.events import TrialStatus
from automlperf.graph import seeds
from automlperf.runner.primary import RunRequest, run_benchmark
from automlperf.store import open_store
from automlperf.train.single import TrainRequest, plan_training, train_planned

from helpers import fast_config


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), stderr=False)


@pytest.mark.parametrize("request_, message", [
    (dict(resume=True, run_dir=None, dataset=None), "--resume needs the --run-dir"),
    (dict(resume=True, dataset="imagenet"), "keeps its configuration"),
    (dict(resume=True, dataset=None, duration="later"), "--duration: .later. is not a duration"),
    (dict(duration="soon"), "--duration: 'soon' is not a duration"),
    (dict(dataset="imagenet"), "imagenet needs --data-dir"),
    (dict(launcher="mpi"), "--launcher must be local, slurm or external, not 'mpi'"),
])
def test_a_request_that_cannot_run_is_refused_before_anything_is_written(tmp_path, request_,
                                                                          message):
    run_dir = tmp_path / "run"
    req = RunRequest(**{"run_dir": run_dir, "dataset": "digits", **request_})
    with pytest.raises(UserError, match=message):
        run_benchmark(req, quiet())
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_run_benchmark_runs_scores_and_writes_everything(tmp_path):
    (tmp_path / "config.toml").write_text(fast_config(duration_s=900, max_rounds=1))
    run_dir = tmp_path / "run"
    outcome = run_benchmark(RunRequest(config=tmp_path / "config.toml", run_dir=run_dir), quiet())
    assert outcome.state == "completed" and outcome.exit_code == 0, outcome.reason
    assert outcome.problems == []
    assert outcome.result_path == run_dir / "result.json"
    assert json.loads(outcome.result_path.read_text())["score"] == outcome.result["score"] > 0
    assert set(outcome.written) >= {"report"} and outcome.written["report"].exists()
    store = open_store(run_dir=run_dir)
    assert [t.status for t in store.trials(1)] == [TrialStatus.COMPLETED]
    store.close()


def test_a_training_plan_refuses_what_cannot_train(tmp_path):
    digits = Config.for_dataset("digits", {"data": {"image_size": 8}})
    with pytest.raises(UserError, match="--graph or --model, not both"):
        plan_training(TrainRequest(config=digits, graph=tmp_path / "g.json", model="resnet_small"))
    graph = tmp_path / "g.json"
    graph.write_text(seeds.resnet_small(10, 16, 1).to_json())
    with pytest.raises(UserError, match="pick a matching --image-size or graph"):
        plan_training(TrainRequest(config=digits, graph=graph))
    with pytest.raises(UserError, match="cannot read graph file"):
        plan_training(TrainRequest(config=digits, graph=tmp_path / "none.json"))
    with pytest.raises(UserError, match="cifar10 needs --data-dir"):
        plan_training(TrainRequest(config=Config.for_dataset("cifar10")))


@pytest.mark.slow
def test_train_planned_trains_and_keeps_the_best_weights(tmp_path):
    digits = Config.for_dataset("digits", {"data": {"image_size": 8}})
    plan = plan_training(TrainRequest(config=digits, model="resnet_small", epochs=2, batch_size=128,
                                      weights_out=tmp_path / "w.safetensors"))
    assert plan.spec.batch_size == 128 and plan.spec.patience == 3
    assert "digits" in plan.describe()
    seen = []
    result = train_planned(plan, on_epoch=seen.append)
    assert result.outcome.status == TrialStatus.COMPLETED, result.outcome.reason
    assert [e.epoch for e in result.epochs] == [0, 1] and seen == result.epochs
    assert result.ops == sum(e.ops for e in seen) > 0 and result.seconds > 0
    assert (tmp_path / "w.safetensors").exists()
