"""Provenance and the time breakdown, by hand (no processes)."""

from dataclasses import dataclass, field

import pytest

from automlperf.measure import provenance
from automlperf.measure.breakdown import OF_TRAINING, PARTS, breakdown


def test_performance_variables_are_kept_and_secrets_redacted():
    env = {"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "8", "HOME": "/root",
           "SLURM_JOB_ID": "12", "TORCH_HOME": "/x", "CUDA_VISIBLE_DEVICES": "0,1",
           "NCCL_SECRET_TOKEN": "hunter2", "SLURM_API_KEY": "abc",
           "TORCH_STORE": "postgresql://me:pw@db/x", "PATH": "/bin"}
    out = provenance.environment(env)
    assert set(out) == {"NCCL_IB_HCA", "OMP_NUM_THREADS", "SLURM_JOB_ID", "TORCH_HOME",
                        "CUDA_VISIBLE_DEVICES", "NCCL_SECRET_TOKEN", "SLURM_API_KEY",
                        "TORCH_STORE"}
    assert out["NCCL_SECRET_TOKEN"] == out["SLURM_API_KEY"] == "***"
    assert out["TORCH_STORE"] == "postgresql://me:***@db/x" and out["OMP_NUM_THREADS"] == "8"


def test_the_source_hash_follows_the_files(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.j2").write_text("{{ x }}")
    first = provenance.source_hash(tmp_path)
    assert first == provenance.source_hash(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.source_hash(tmp_path) != first


def test_collect_names_version_packages_and_commit():
    record = provenance.collect()
    assert record["automlperf_version"] and "torch" in record["packages"]
    assert "numpy" in record["packages"] and record["source_hash"].startswith("sha256:")
    if record["git"] is not None:  # run from a checkout
        assert len(record["git"]["commit"]) == 40


@dataclass
class Ep:
    trial_id: int
    started_at: float
    ended_at: float
    train_images: int = 800
    images_per_s: float = 100.0  # 8 s of training
    data_share: float = 0.25
    device_share: float | None = 0.5


@dataclass
class Tr:
    id: int
    replica_index: int
    created_at: float
    hparams: dict = field(default_factory=dict)


@dataclass
class Seg:
    started_at: float
    deadline_at: float
    last_seen: float
    ended_at: float | None = None


def test_the_breakdown_splits_each_replicas_run_time_without_gaps():
    seg = [Seg(0.0, 100.0, 100.0, 100.0)]
    trials = [Tr(1, 0, 5.0), Tr(2, 0, 33.0, {"candidate_wait_s": 2.0}), Tr(3, 1, 4.0)]
    epochs = [Ep(1, 10.0, 20.0), Ep(1, 20.0, 30.0), Ep(2, 35.0, 45.0),
              Ep(2, 95.0, 105.0),  # in flight at the deadline: not counted
              Ep(3, 40.0, 50.0)]
    out = breakdown(epochs, trials, seg, [{"t": 50.0, "cpu_percent": 80.0, "gpus": [
        {"util": 90.0}, {"util": 70.0}]}, {"t": 500.0, "cpu_percent": 0.0}])
    r0 = out["replicas"][0]
    assert r0["start_to_first_epoch_s"] == 10.0 and r0["lost_at_deadline_s"] == 55.0
    assert r0["training_s"] == 24.0 and r0["validation_s"] == 6.0 and r0["data_wait_s"] == 6.0
    assert r0["candidate_wait_s"] == 2.0 and r0["between_trials_s"] == 3.0
    assert r0["device_wait_s"] == 12.0  # half of each epoch's training
    assert sum(r0[k] for k in PARTS if k not in OF_TRAINING) == pytest.approx(100.0)
    r1 = out["replicas"][1]
    assert (r1["start_to_first_epoch_s"], r1["lost_at_deadline_s"]) == (40.0, 50.0)
    assert out["total"]["session_s"] == 200.0
    assert out["shares"]["training_s"] == pytest.approx(32 / 200)
    assert out["utilisation"] == {"accelerator": pytest.approx(0.8), "cpu": 0.8, "samples": 1}


def test_a_replica_without_a_counted_epoch_spent_its_time_starting():
    out = breakdown([Ep(1, 10.0, 70.0)], [Tr(1, 0, 5.0)], [Seg(0.0, 60.0, 60.0, 60.0)])
    assert out["replicas"][0]["start_to_first_epoch_s"] == 60.0
