"""The health sweep before the clock (`automlperf sweep`): each node checks what its replica
needs and records it; the batch host names the nodes that cannot train, and leaves them out
where the job asks. Run here on this machine's own file systems (its root, /dev/shm) and
without a GPU; the GPUs' verdict is judged from what NVML would report (this machine has no
NVIDIA driver), and the sweep in a job runs on the local SLURM cluster
(tests/cluster/test_node_loss.py)."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.runner import health

NVML_GOOD = {"source": "NVML", "count": 8, "driver": "550.54.15",
             "devices": [{"index": i, "name": "H100", "uncorrected_ecc": 0,
                          "remap_pending": False, "remap_failed": False} for i in range(8)]}


def test_gpus_are_counted_and_their_memory_errors_named():
    assert health.judge_accelerators(8, NVML_GOOD) == ([], [])
    assert health.judge_accelerators(0, {"source": "device files", "count": 0}) == ([], [])
    seven = dict(NVML_GOOD, count=7, devices=NVML_GOOD["devices"][:7])
    problems, _ = health.judge_accelerators(8, seven)
    assert problems == ["7 of the 8 GPUs the job asked for are visible (NVML)"]
    sick = json.loads(json.dumps(NVML_GOOD))
    sick["devices"][3]["uncorrected_ecc"] = 2
    sick["devices"][5]["remap_failed"] = True
    sick["devices"][6]["remap_pending"] = True
    problems, warnings = health.judge_accelerators(8, sick)
    assert problems == ["GPU 3 has 2 uncorrected ECC error(s) since its driver loaded: drain "
                        "the node, or reset the GPU",
                        "GPU 5 failed to remap a row of its memory: drain the node"]
    assert warnings == ["GPU 6 has a memory row remapping pending (a GPU reset applies it)"]
    # A GPU that does not tell its ECC counts (None) is no problem.
    quiet = dict(NVML_GOOD, devices=[{"index": 0, "uncorrected_ecc": None}])
    assert health.judge_accelerators(1, dict(quiet, count=1)) == ([], [])


def test_this_machine_without_a_gpu_is_named_when_the_job_asked_for_some():
    facts = health.gpu_facts()
    assert facts["count"] == 0 and facts["source"] in ("NVML", "device files")
    problems, _ = health.judge_accelerators(4, facts)
    assert problems and problems[0].startswith("0 of the 4 GPUs the job asked for are visible")


def test_the_staging_folder_must_be_there_on_disk_with_room(tmp_path):
    facts, problems, warnings = health.check_stage_target(tmp_path / "missing", 10)
    assert problems == [f"the staging folder {tmp_path / 'missing'} is not there (its file "
                        "system not mounted?)"]
    point, fstype = health.mount_of(tmp_path)
    facts, problems, warnings = health.check_stage_target(tmp_path, 1000)
    assert facts["mount"] == point and facts["fstype"] == fstype and facts["free_bytes"] > 0
    assert not problems
    if point == "/":
        assert warnings == [f"the staging folder {tmp_path} is on the root file system, not a "
                            "mount of its own"]
    _, problems, _ = health.check_stage_target(tmp_path, 10**18)
    assert problems and "GB free and the dataset needs 1000000000.00 GB" in problems[0]
    if health.mount_of(Path("/dev/shm"))[1] == "tmpfs":
        _, problems, _ = health.check_stage_target(Path("/dev/shm"), 10)
        assert problems == ["the staging folder /dev/shm is on tmpfs (/dev/shm): the copy would "
                            "live in the memory training needs; give --stage-to a disk"]
    # The deepest mount holding a path is its own.
    mounts = [("/", "ext4"), ("/local", "xfs"), ("/local/scratch", "tmpfs"), ("/loc", "nfs")]
    assert health.mount_of(Path("/local/scratch/x"), mounts) == ("/local/scratch", "tmpfs")
    assert health.mount_of(Path("/local/other"), mounts) == ("/local", "xfs")
    assert health.mount_of(Path("/location"), mounts) == ("/", "ext4")


@pytest.fixture
def run_with_data(tmp_path):
    from automlperf.dataset.shared import build_shared_index
    from trees import make_tree

    data = make_tree(tmp_path / "imagenet", per_class=(1, 1), classes=["n01440764", "n01443537"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    build_shared_index(data, run_dir)
    return run_dir, data


def test_a_node_records_what_it_found_and_the_batch_host_names_the_bad_ones(run_with_data,
                                                                            tmp_path, monkeypatch):
    run_dir, data = run_with_data
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    done = CliRunner().invoke(app, ["sweep", "--run-dir", str(run_dir), "--stage-to",
                                    str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("n1: can train")
    record = json.loads((run_dir / "health" / "n1.json").read_text())
    assert record["job"] == "77" and record["problems"] == [] and record["stage_to"]["free_bytes"]
    # Another node: no data there (its mount missing), asked for GPUs it has not, and the
    # run's image file unreadable.
    (run_dir / "container.json").write_text(json.dumps(
        {"runtime": "apptainer", "image": str(tmp_path / "missing.sif")}))
    hidden = data.with_name("hidden")
    data.rename(hidden)
    try:
        monkeypatch.setenv("SLURMD_NODENAME", "n2")
        done = CliRunner().invoke(app, ["sweep", "--run-dir", str(run_dir), "--gpus", "2"])
    finally:
        hidden.rename(data)
    assert done.exit_code == 0 and done.output.startswith("n2: cannot train: 0 of the 2 GPUs")
    problems = json.loads((run_dir / "health" / "n2.json").read_text())["problems"]
    assert len(problems) == 3
    assert problems[1].startswith(f"the dataset is not on this node (n2): {data}/train not found")
    assert problems[2] == f"the container image {tmp_path / 'missing.sif'} is not readable here"
    # n3 never answered; a record of another job is not this one's.
    (run_dir / "health" / "n4.json").write_text(json.dumps({"node": "n4", "job": "76",
                                                            "problems": []}))
    bad = health.verdict(run_dir, ["n1", "n2", "n3", "n4"], "77")
    assert list(bad) == ["n2", "n3", "n4"]
    assert bad["n3"] == ["no answer from the health sweep (see logs/sweep-*.log)"]
    lines = health.describe(bad, 4, True)
    assert lines[0] == "health sweep: 3 of 4 node(s) cannot train (left out of the run): n2,n3,n4"
    assert lines[1].startswith("  n2: 0 of the 2 GPUs")
    assert health.describe({}, 4, False) == ["health sweep: all 4 node(s) can train"]
    assert health.srun_nodes(["n1", "n2", "n3", "n4"], bad, True) == "--nodes=1 --exclude=n2,n3,n4"
    assert health.srun_nodes(["n1", "n2", "n3", "n4"], bad, False) == "--nodes=4"


def test_the_job_leaves_bad_nodes_out_only_when_asked_and_never_all(tmp_path, monkeypatch):
    from automlperf.runner import slurm

    monkeypatch.setattr(slurm, "node_names", lambda env=None: ["n1", "n2", "n3"])
    (tmp_path / "health").mkdir()
    for node, problems in (("n1", []), ("n2", ["0 of the 8 GPUs"]), ("n3", [])):
        (tmp_path / "health" / f"{node}.json").write_text(json.dumps(
            {"node": node, "job": "9", "problems": problems}))
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]"}
    assert health.slurm_verdict(tmp_path, env) == (["n1", "n2", "n3"],
                                                   {"n2": ["0 of the 8 GPUs"]}, False)
    env[health.EXCLUDE_ENV] = "1"
    assert health.slurm_verdict(tmp_path, env)[2] is True
    for node in ("n1", "n3"):
        (tmp_path / "health" / f"{node}.json").write_text(json.dumps(
            {"node": node, "job": "9", "problems": ["no data"]}))
    assert health.slurm_verdict(tmp_path, env)[2] is False  # every node bad: none left out
    assert os.environ.get(health.EXCLUDE_ENV) is None


def test_a_node_checks_the_official_archives_before_any_session_proved_them(tmp_path,
                                                                            monkeypatch):
    """The first job of a run on the archives sweeps before its primary's proof writes the
    index: each node sees the three archives there, and the staging folder is held to the
    bytes its copy still needs (a copy kept from an earlier job of the run is read again,
    not copied, so it needs no room a second time)."""
    from automlperf.config import Config
    from automlperf.dataset.archive import NAMES
    from automlperf.runner.staging import staged_root

    archives = tmp_path / "ilsvrc2012"
    archives.mkdir()
    sizes = dict(zip(NAMES.values(), (3 << 20, 2 << 20, 1 << 20)))
    for name, size in sizes.items():
        with open(archives / name, "wb") as f:
            f.truncate(size)
    run_dir, local = tmp_path / "run", tmp_path / "local"
    run_dir.mkdir()
    local.mkdir()
    settings = Config.parse({"run": {"official": False},
                             "data": {"dataset": "imagenet", "data_dir": str(archives)}})
    (run_dir / "submitted-config.toml").write_text(settings.to_toml())
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert health.check_data(run_dir) == []
    assert health.stage_need(run_dir, local, "n1") == sum(sizes.values())
    kept = staged_root(run_dir, local, "n1")
    kept.mkdir()
    train = NAMES["train"]
    with open(kept / train, "wb") as f:
        f.truncate(sizes[train])
    assert health.stage_need(run_dir, local, "n1") == sum(sizes.values()) - sizes[train]
    assert health.stage_need(run_dir, local, "n2") == sum(sizes.values())  # n2 keeps none
    record = health.sweep(run_dir, stage_to=local)
    assert record["node"] == "n1" and record["problems"] == [], record
    # A node that does not see the validation archive cannot train.
    (archives / NAMES["val"]).rename(tmp_path / "elsewhere")
    problems = health.sweep(run_dir, stage_to=local)["problems"]
    assert problems == [f"the dataset is not on this node ({NAMES['val']} not readable in "
                        f"{archives}): make the archive folder reachable here, at the same path"]
