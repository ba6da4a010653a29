"""mllog.txt and system_desc.json, read back with the real mlperf-logging package: its log
parser, its compliance checker with our rules file, its system description checker."""

import json

import pytest

from automlperf.config import Config
from automlperf.graph import seeds
from automlperf.submission.mlperf import rules_path, system_desc, write_mllog
from automlperf.measure.result import build_result
from automlperf.store import EpochRecord, TrialStatus, open_store
from helpers import new_claim

SYSTEM = {"host": "node1", "os": "Linux 6.1", "memory_gib": 24.0, "nodes": 1,
          "cpu": {"model": "AMD EPYC 9654", "physical_cores": 96, "logical_cores": 192},
          "accelerators": [{"index": 0, "name": "AMD Instinct MI300X", "memory_gib": 192.0,
                            "peak_ops": 1307.4e12, "peak_precision": "bf16"}],
          "software": {"python": "3.11.2", "torch": "2.13.0", "optuna": "5.0.0"}}


def epoch(run_id, trial_id, number, start, acc):
    return EpochRecord(trial_id=trial_id, epoch=number, started_at=start, ended_at=start + 10,
                       train_images=1437, val_images=360, steps=12, ops=10**9,
                       train_loss=1.0, val_accuracy=acc, precision="fp32", batch_size=128,
                       world_size=1, data_share=0.1, images_per_s=100.0, run_id=run_id)


@pytest.fixture
def run(tmp_path):
    """A store with two replicas whose trials' epochs overlap in time."""
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}", create=True)
    config = Config.for_dataset("builtin", {}, "test")
    t0 = 1_700_000_000.0
    run_id = store.create_run("r", config.model_dump(mode="json"), SYSTEM, 100, t0)
    segment = store.start_segment(run_id, t0 + 1, t0 + 101)
    graph = seeds.seed("resnet_small", 10, 8, 1)
    for index in (0, 1):
        rep = store.register_replica(run_id, index, segment, "node1", 1, ["cpu"], t0 + 1)
        g = graph.to_json(None)
        trial = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=index,
                                            graph_hash=f"h{index}", graph_json=g, now=t0 + 2))
        for n in range(3):
            store.record_epoch(epoch(run_id, trial, n, t0 + 2 + 5 * index + 10 * n,
                                     0.5 + 0.1 * n))
        store.finish_trial(trial, TrialStatus.COMPLETED, t0 + 40, best_accuracy=0.7)
    store.touch_segment(run_id, segment, t0 + 101)
    store.end_segment(run_id, segment, t0 + 101)
    return store, run_id, build_result(store, run_id, config, SYSTEM)


def check(path, rules):
    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker("training", "6.1.0", quiet=True, werror=False)
    valid = checker.check_file(str(path), str(rules))
    return valid, checker


def test_mllog_parses_and_passes_the_checker_with_our_rules(run, tmp_path):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    store, run_id, result = run
    path = write_mllog(tmp_path / "mllog.txt", store, run_id, result, SYSTEM, "Example Org")
    lines, errors = parse_file(str(path), ruleset="6.1.0")
    assert errors == []
    keys = [line.key for line in lines]
    assert keys[:5] == ["submission_benchmark", "submission_org", "submission_division",
                        "submission_status", "submission_platform"]
    assert keys.count("epoch_start") == keys.count("eval_accuracy") == 6
    assert keys[-1] == "run_stop" and lines[-1].value["metadata"]["status"] == "success"
    evals = [line.value for line in lines if line.key == "eval_accuracy"]
    assert sorted(v["value"] for v in evals) == pytest.approx([0.5, 0.5, 0.6, 0.6, 0.7, 0.7])
    assert [line.timestamp for line in lines] == sorted(line.timestamp for line in lines)
    valid, checker = check(path, rules_path())
    assert valid, checker.log_messages()
    # Written again from the store: the same file.
    again = write_mllog(tmp_path / "again.txt", store, run_id, result, SYSTEM, "Example Org")
    assert again.read_text() == path.read_text()


def test_a_simulated_runs_log_says_so(run, tmp_path):
    """The log travels on its own: it must not read like a measurement."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    store, run_id, result = run
    simulation = {"sustained_ops_per_device": 2e14, "time_compression": 1.0,
                  "device_memory_gib": 80.0}
    result = {**result, "simulated": True, "simulation": simulation}
    path = write_mllog(tmp_path / "mllog.txt", store, run_id, result, SYSTEM, "Example Org")
    lines, errors = parse_file(str(path), ruleset="6.1.0")
    assert errors == []
    by_key = {line.key: line.value for line in lines}
    assert by_key["submission_status"]["value"] == "research"
    assert by_key["automlperf_simulated"]["value"] is True
    assert simulation.items() <= by_key["automlperf_simulated"]["metadata"].items()
    valid, checker = check(path, rules_path())
    assert valid, checker.log_messages()


def test_the_checker_rejects_a_log_missing_its_end(run, tmp_path):
    store, run_id, result = run
    path = write_mllog(tmp_path / "mllog.txt", store, run_id, result, SYSTEM, "Example Org")
    cut = tmp_path / "cut.txt"
    cut.write_text("".join(line for line in path.read_text().splitlines(True) if "run_stop" not in line))
    valid, _ = check(cut, rules_path())
    assert not valid


def test_system_desc_has_mlperf_trainings_fields(run, tmp_path):
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    _, _, result = run
    desc = system_desc(SYSTEM, result, "Example Org")
    path = tmp_path / "system_desc.json"
    path.write_text(json.dumps(desc))
    valid, name, _, _ = check_system_desc(str(path), "training", "6.1.0")
    assert valid and name == desc["system_name"]
    assert desc["accelerator_model_name"] == "AMD Instinct MI300X"
    assert desc["accelerators_per_node"] == "1" and desc["framework"] == "PyTorch 2.13.0"
