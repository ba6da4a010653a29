"""A cluster job's clock: on the local SLURM cluster, `automlperf slurm --dataset imagenet
--data-dir DIR` on a folder whose scan is slow (62,400 files on a file system that serves
300 reads a second) ends with the run's whole duration and a written result, the data
having changed after submission so that the job's primary scans it again before its clock.
Simulated accelerators: the job's start-up and clock are the point, not the training."""

import json
import re
import subprocess

import pytest

from helpers import cli, sim_config, wait_for
from slowfs import SlowFileSystem, many_files
from test_slurm import wait_job

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# The clock is not what these tests are about: a short run, whose epochs in flight at the
# deadline get a short grace (the grace has its own tests, tests/runner/test_replica.py).
DURATION_S = 20
GRACE_S = 2


def test_a_slow_scan_costs_the_job_not_the_runs_clock(slurm_cluster, tmp_path):
    with SlowFileSystem(tmp_path / "fs", reads_per_s=300) as fs:
        data = fs.mount / "imagenet"
        files = many_files(data, 60_000)
        fs.cold()
        # An epoch of ResNet-50 on ImageNet's 1.28 M images lasts about 2 s of the clock.
        (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e14, time_compression=100.0,
                                                      deadline_grace_s=GRACE_S))
        run_dir = tmp_path / "run"
        done = cli("slurm", "--nodes", 2, "--duration", f"{DURATION_S}s", "--dataset", "imagenet",
                   "--data-dir", data, "--config", tmp_path / "sim.toml", "--run-dir", run_dir,
                   env=slurm_cluster, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"dataset: {files:,} files scanned in" in done.stdout
        script = (run_dir / "automlperf.sbatch").read_text()
        assert "#SBATCH --no-kill" in script and "--data-dir" not in script
        # The data changes before the job starts, and nothing of it is cached: the job's
        # primary walks the slow folder again, inside the job, before its clock.
        (data / "train" / "n00000000" / "late.JPEG").write_bytes(b"x")
        fs.cold()
        job = subprocess.run(["sbatch", "--parsable", str(run_dir / "automlperf.sbatch")],
                             env=slurm_cluster, capture_output=True, text=True, check=True
                             ).stdout.strip().split(";")[0]
        assert wait_job(job, slurm_cluster) == "COMPLETED"
    out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "automlperf primary finished with status 0" in out, out
    startup = json.loads((run_dir / "system.json").read_text())["startup"]
    assert startup["dataset_index"] == "built" and startup["dataset_s"] > 0
    assert re.search(r"start-up before the clock: [\d.]+ s \(.*dataset index built", out)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["elapsed_s"] >= DURATION_S and not result["interrupted"]
    assert result["dataset_identity"]["files"] == files + 1
    assert (run_dir / "report.html").exists()


def test_a_run_stopped_with_scancel_resumes_extended_with_the_time_it_still_needs(slurm_cluster,
                                                                             tmp_path):
    """docs/cluster.md's way to stop a job cleanly, `scancel --batch --signal=TERM`, writes the
    result of the time run so far; `automlperf slurm --resume --run-dir RUN_DIR --submit` submits
    the same script with a time limit for what is left, and the run ends with its whole duration."""
    from helpers import opened

    # The scancel must come before the first session's deadline: its clock starts before the
    # replicas (their start-up, then a first epoch, all slower on a loaded machine).
    first_s, extended_s = 36, 44
    (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e11, stop_grace_s=10,
                                                  deadline_grace_s=GRACE_S))
    run_dir = tmp_path / "run"
    done = cli("slurm", "--nodes", 2, "--duration", f"{first_s}s", "--config",
               tmp_path / "sim.toml", "--run-dir", run_dir, "--submit", env=slurm_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    store = opened(run_dir)
    wait_for(lambda: bool(store.epochs(1)), 600, "a first epoch")
    store.close()
    subprocess.run(["scancel", "--batch", "--signal=TERM", job], env=slurm_cluster, check=True)
    # A clean stop is no failure to SLURM (sacct, the job's state): the job ends with 0.
    assert wait_job(job, slurm_cluster) == "COMPLETED"
    first = json.loads((run_dir / "result.json").read_text())
    assert first["interrupted"] and 0 < first["elapsed_s"] < first_s
    out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "automlperf primary finished with status 130" in out, out
    assert "the run stopped cleanly; continue it with: automlperf slurm --resume" in out

    replica_log = (run_dir / "logs" / "replica-0.log").read_text()
    assert replica_log
    # Options given with --resume reach this submission (sbatch's own win over the script's),
    # and --duration extends the run when the job starts its clock (nothing is written here).
    done = cli("slurm", "--resume", "--run-dir", run_dir, "--submit", "--duration",
               f"{extended_s}s", "--sbatch=--comment=resumed-after-scancel",
               env=slurm_cluster, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    left = float(re.search(r"([\d.]+) s of the run left", done.stdout).group(1))
    assert left == pytest.approx(extended_s - first["elapsed_s"], abs=1)
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    shown = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=slurm_cluster,
                           capture_output=True, text=True).stdout
    assert "Comment=resumed-after-scancel" in shown
    assert wait_job(job, slurm_cluster) == "COMPLETED"
    second = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert f"the run now lasts 0:00:{extended_s}" in second, second
    # The replicas' logs go on where the first job's ended.
    again = (run_dir / "logs" / "replica-0.log").read_text()
    assert again.startswith(replica_log) and len(again) > len(replica_log)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["elapsed_s"] == pytest.approx(extended_s, abs=1e-6)
    assert not result["interrupted"] and len(result["segments"]) == 2
    assert [(e["from_s"], e["to_s"]) for e in result["extensions"]] == [(first_s, extended_s)]
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr


def test_each_node_stages_the_archives_reads_its_copy_and_cleans_up(slurm_cluster, tmp_path):
    """`automlperf slurm --stage-to DIR` on the official archives: before the clock every
    node copies them to its own storage (their MD5s computed on the way, the copy read back)
    and its replica reads the copy once its MD5s are the session's; a node whose staging
    fails reads the shared copy; the job's end removes the copies. The nodes here share one
    disk, so each has a folder of its own under DIR; n2's is made to fail."""
    from trees import make_tree, official_archives

    tree = make_tree(tmp_path / "folder", per_class=(3, 1))
    env = dict(slurm_cluster)
    table = official_archives(tree, tmp_path / "shared" / "ilsvrc2012", env)
    data = tmp_path / "shared" / "ilsvrc2012"
    (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e14, time_compression=100.0,
                                                  deadline_grace_s=GRACE_S))
    run_dir, local = tmp_path / "run", tmp_path / "local"
    local.mkdir()  # the nodes' scratch folder, there before the job
    (local / "automlperf-run-n2").write_text("not a folder")  # n2's staging fails
    done = cli("slurm", "--nodes", 2, "--duration", f"{DURATION_S}s", "--dataset", "imagenet",
               "--data-dir", data, "--config", tmp_path / "sim.toml", "--run-dir", run_dir,
               "--stage-to", local, "--submit", env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "start-up 10 min" in done.stdout  # 5 minutes, the proof's second, 5 for staging
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    assert wait_job(job, slurm_cluster) == "COMPLETED"
    out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "automlperf primary finished with status 0" in out and "dataset staged on the nodes" in out
    # The health sweep ran on both nodes before the staging, and found them able to train
    # (n2's staging fails later, on what its folder holds).
    assert "health sweep: all 2 node(s) can train" in out
    assert sorted(p.name for p in (run_dir / "health").glob("*.json")) == ["n1.json", "n2.json"]
    staged = {p.name: p.read_text() for p in (run_dir / "logs").glob("stage-*.log")}
    text = "".join(staged.values())
    assert re.search(r"n1: the archives \([\d.]+ GB, [\d.]+ GB copied in [\d.]+ s, read back "
                     r"in [\d.]+ s\) staged in \S+/automlperf-run-n1 in [\d.]+ s; MD5s "
                     f"ILSVRC2012_img_train.tar {table['train']}", text), text
    assert "staging on n2 failed: " in text and "its replica reads the shared copy" in text
    assert text.count("removed this node's copy of the dataset") == 1
    replicas = "".join(p.read_text() for p in (run_dir / "logs").glob("replica-*.log"))
    assert replicas.count("reading the archives staged on this node") == 1, replicas
    assert not list((run_dir / "staging").glob("n?.json"))
    kept = [json.loads(p.read_text()) for p in sorted((run_dir / "staging").glob("n?-*.json"))]
    assert [(k["node"], k["kind"]) for k in kept] == [("n1", "archives")]
    assert {p: a["md5"] for p, a in kept[0]["archives"].items()} == table
    assert kept[0]["removed_at"] >= kept[0]["at"] and kept[0]["copy_s"] > 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["data_sources"] == {"staged": 1, "shared": 1}
    assert sorted(n["data"]["source"] for n in result["node_descriptions"]) == ["shared", "staged"]
    # The staged copy's MD5s, computed by its replica during the session (a record is a file).
    (staged_node,) = [n for n in result["node_descriptions"] if n["data"]["source"] == "staged"]
    assert staged_node["data"]["computed"] == table
    assert "data_changed" not in {v["rule"] for v in result["violations"]}
    assert result["replicas"] == 2 and not result["retired"] and not result["failures"]
