"""Clusters: the benchmark submitted to a real SLURM cluster, with real PostgreSQL stores."""

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.runner.joblimits import margins
from automlperf.runner.slurm import format_time
from automlperf.testing.slurm import kill_replica
from helpers import cli, fast_config

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

STANDINS = Path(__file__).resolve().parents[1] / "standins"

def wait_job(job, env, timeout=1200):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True)
        if not queue.stdout.strip():
            break
        time.sleep(1)
    else:
        raise AssertionError(f"job {job} still queued or running after {timeout} s")
    state = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=env,
                           capture_output=True, text=True).stdout
    return re.search(r"JobState=(\S+)", state).group(1)


def submit(tmp_path, env, run_dir, *extra, rounds=2):
    """The job ends when both replicas have trained their rounds (its duration is only a
    guard), so what the tests see does not depend on the machine's speed."""
    (tmp_path / "fast.toml").write_text(fast_config(lease_timeout_s=8, max_rounds=rounds))
    done = cli("slurm", "--nodes", 2, "--duration", "15m", "--run-dir", run_dir,
               "--config", tmp_path / "fast.toml", "--small-task", "--submit", *extra, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"submitted job (\d+)", done.stdout).group(1)


def stored(run_dir):
    """Trials and epochs of a finished job's run (its private server is started to read)."""
    from automlperf.store.opening import run_store

    with run_store(run_dir) as store:
        return store.trials(1), store.epochs(1)


def test_the_script_is_valid_for_sbatch(slurm_cluster, tmp_path):
    done = cli("slurm", "--nodes", 2, "--duration", "2h", "--run-dir", tmp_path / "r",
               "--gpus-per-node", 0, "--partition", "debug", "--small-task", "--test-only",
               env=slurm_cluster)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stdout
    script = (tmp_path / "r" / "automlperf.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=debug" in script
    # 5 min of start-up, the 2 h run, its grace for epochs in flight (a quarter: 30 min), the
    # signal's lead (3 % of run and grace) and SLURM's minute.
    assert "#SBATCH --time=2:41:00" in script and "#SBATCH --signal=B:TERM@270" in script
    assert "#SBATCH --no-kill" in script and "AUTOMLPERF_JOB_MARGIN_S=330" in script
    assert script.count("2h") == 0 and "--duration 7200s" in script  # one place holds it


def test_time_limits_hold_the_start_up_and_leave_room_for_the_result():
    assert margins(3600) == (300 + 3600 + 120 + 60, 120)
    assert margins(7200 * 10) == (300 + 72000 + 2160 + 60, 2160)
    assert margins(3600, startup_s=900) == (900 + 3600 + 120 + 60, 120)
    assert format_time(3780) == "1:03:00" and format_time(90000) == "1-01:00:00"


def test_a_submitted_benchmark_runs_two_replicas(slurm_cluster, tmp_path):
    """Each replica's step in an Apptainer image (tests/standins/apptainer: this host's
    installation, as an image built from it would hold): the image is named, with its
    digest, in system.json, and each replica's record says what it trained with."""
    run_dir = tmp_path / "run"
    image = tmp_path / "automlperf.sif"
    image.write_bytes(b"an image\n" * 1000)
    env = dict(slurm_cluster, PATH=os.pathsep.join(
        [str(STANDINS), str(Path(sys.executable).parent), slurm_cluster.get("PATH", os.environ["PATH"])]))
    job = submit(tmp_path, env, run_dir, "--container-image", image,
                 "--container-runtime", "apptainer")
    assert wait_job(job, slurm_cluster) == "COMPLETED"
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    assert "automlperf primary finished with status 0" in out
    trials, epochs = stored(run_dir)
    assert {t.replica_index for t in trials} == {0, 1}
    assert {e.trial_id for e in epochs} & {t.id for t in trials if t.replica_index == 1}
    system = json.loads((run_dir / "system.json").read_text())
    assert system["slurm"]["SLURM_JOB_ID"] == job and system["nodes"] == 2
    assert system["replica_image"] == {"runtime": "apptainer", "image": str(image), "digest":
                                       "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()}
    result = json.loads((run_dir / "result.json").read_text())
    assert result["replicas"] == 2 and result["score"] > 0
    assert [n["software"]["container"] for n in result["node_descriptions"]] == [
        {"runtime": "apptainer", "image": str(image), "name": "automlperf.sif"}] * 2
    assert (run_dir / "report.html").exists()
    assert not any(t.status == "running" for t in trials)
    # The run's private PostgreSQL server is stopped; check starts it again to verify.
    assert not (run_dir / "postgres" / "pgdata" / "postmaster.pid").exists()
    done = cli("check", run_dir, timeout=180)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
    pw = run_dir / "postgres" / "pg.password"
    assert stat.S_IMODE(pw.stat().st_mode) == 0o600


def test_a_dead_node_is_a_failed_replica_not_a_failed_run(slurm_cluster, pg_server, pg_url, tmp_path):
    """With an external PostgreSQL store whose password is given on the command line: kill
    replica 1 mid-run (its processes, as a crash on its node would); the run completes and
    counts what replica 1 finished, and the password appears in no file but its private
    one."""
    run_dir = tmp_path / "run"
    job = submit(tmp_path, slurm_cluster, run_dir, "--store", pg_url, rounds=4)
    env = dict(slurm_cluster)
    from automlperf.store import open_store

    store = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            store = store or open_store(pg_url)
            if any(t.replica_index == 1 and t.epochs_done >= 1 for t in store.trials(1)):
                break
        except Exception:  # the run has not created its tables yet
            pass
        time.sleep(1)
    else:
        raise AssertionError("replica 1 never finished an epoch")
    killed_at = time.time()
    kill_replica(run_dir, 1)
    gone_at = time.time()  # replica 1's processes are killed by now
    assert wait_job(job, env) == "COMPLETED"
    trials = store.trials(1)
    epochs = store.epochs(1)
    from automlperf.measure.score import counted_epochs

    counted = {(e.trial_id, e.epoch) for _, e in counted_epochs(epochs, store.segments(1))}
    mine = [t for t in trials if t.replica_index == 1]
    done_by_1 = {(e.trial_id, e.epoch) for e in epochs if e.trial_id in {t.id for t in mine}}
    assert done_by_1 and done_by_1 <= counted
    assert all(t.created_at <= gone_at for t in mine)  # replica 1 stopped there
    assert any(t.replica_index == 0 and t.created_at > killed_at for t in trials)  # 0 went on
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and not result["interrupted"]
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    assert "automlperf primary finished with status 0" in out

    secret = pg_server.password
    holders = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert holders == [run_dir / ".store-password"]
    assert stat.S_IMODE(holders[0].stat().st_mode) == 0o600
    assert "***" not in (run_dir / "run.json").read_text() and "@" in (run_dir / "run.json").read_text()
    done = cli("check", run_dir, "--store", pg_url, timeout=180)
    assert done.returncode == 0, done.stdout


def test_missing_sbatch_is_a_clear_error(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))
    done = cli("slurm", "--nodes", 1, "--duration", "1h", "--run-dir", tmp_path / "r",
               "--store", "postgresql://u@db/x", "--submit", env=env)
    assert done.returncode == 2 and "sbatch not found" in done.stderr


def test_missing_postgres_binaries_is_a_clear_error(tmp_path, monkeypatch):
    import automlperf.store.pgserver as pg

    monkeypatch.setattr(pg.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(pg.glob, "glob", lambda *a, **k: [])
    result = CliRunner().invoke(app, ["slurm", "--nodes", "1", "--duration", "1h",
                                      "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "PostgreSQL server binaries (initdb, pg_ctl) not found" in result.output
    assert "--store" in result.output


def slurm_cli(*args):
    return CliRunner().invoke(app, ["slurm", *map(str, args)])


def test_a_time_limit_that_cannot_start_the_clock_is_refused_with_what_it_holds(tmp_path):
    """A limit must hold a start-up, the run, the grace for epochs in flight (a quarter of
    the duration) and 2 minutes for the result; one that does not is refused at submission,
    naming the longest run it holds, rather than queue a job that can never start its clock."""
    base = ["--nodes", 1, "--duration", "1h", "--store", "postgresql://u@db/x"]
    result = slurm_cli(*base, "--time-limit", "1h10m", "--run-dir", tmp_path / "a")
    assert result.exit_code == 2 and "leaves no room to start the clock of a 60m run" in result.output
    assert "(a start-up of 60 s, the run, 900 s of grace" in " ".join(result.output.split())
    # (70 min - 3 min) / 1.25: the longest run whose clock it starts.
    assert "at most 53m" in result.output and "1:18:00" in result.output
    assert not (tmp_path / "a" / "automlperf.sbatch").exists()
    assert "no run" in slurm_cli(*base, "--time-limit", "2m", "--run-dir", tmp_path / "b").output
    # The least limit that holds it is accepted, and the signal's lead fits in it.
    result = slurm_cli(*base, "--time-limit", "1h18m", "--run-dir", tmp_path / "c")
    assert result.exit_code == 0, result.output
    script = (tmp_path / "c" / "automlperf.sbatch").read_text()
    assert "#SBATCH --time=1:18:00" in script and "#SBATCH --signal=B:TERM@60" in script


def test_an_official_submission_names_its_gpus(tmp_path):
    """Without --gpus-per-node an official job would queue, then every replica would stop
    on its node for want of an accelerator: refused before its data is even scanned."""
    (tmp_path / "data").mkdir()
    result = slurm_cli("--nodes", 2, "--config", "official", "--data-dir", tmp_path / "data",
                       "--run-dir", tmp_path / "r", "--store", "postgresql://u@db/x")
    assert result.exit_code == 2 and "pass --gpus-per-node N" in result.output
    assert not (tmp_path / "r" / "automlperf.sbatch").exists()


def test_class_folders_without_images_are_refused_in_one_line(tmp_path):
    for folder in ("train/n01", "val/n01"):
        (tmp_path / "data" / folder).mkdir(parents=True)
    result = slurm_cli("--nodes", 1, "--dataset", "imagenet", "--data-dir", tmp_path / "data",
                       "--unofficial", "--run-dir", tmp_path / "r", "--store", "postgresql://u@db/x")
    assert result.exit_code == 2, result.output
    assert "the job could not train on" in result.output and "no images" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "r" / "automlperf.sbatch").exists()


def test_a_resume_keeps_the_run_and_takes_new_submission_options(tmp_path):
    run_dir = tmp_path / "r"
    assert slurm_cli("--nodes", 2, "--duration", "1h", "--run-dir", run_dir, "--store",
                     "postgresql://u@db/x", "--partition", "gpu", "--small-task").exit_code == 0
    result = slurm_cli("--resume", "--run-dir", run_dir, "--nodes", 4, "--gpus-per-node", 2)
    assert result.exit_code == 2
    assert "--nodes, --gpus-per-node cannot change on --resume" in " ".join(result.output.split())
    result = slurm_cli("--resume", "--run-dir", run_dir, "--duration", "2h")
    assert result.exit_code == 2 and "never started its clock" in " ".join(result.output.split())
    result = slurm_cli("--resume", "--run-dir", run_dir, "--time-limit", "1h")
    assert result.exit_code == 2 and "give at least 1:20:00" in " ".join(result.output.split())
    result = slurm_cli("--resume", "--run-dir", run_dir, "--partition", "long", "--account",
                       "proj", "--sbatch=--exclude=n3", "--time-limit", "2h")
    assert result.exit_code == 0, result.output
    assert ("submit it with: sbatch --time=2:00:00 --partition=long --account=proj "
            f"--exclude=n3 {run_dir.resolve()}/automlperf.sbatch") in " ".join(result.output.split())


PROBE = """
import subprocess, sys
from pathlib import Path
from automlperf.runner.slurm import SlurmLauncher, cpus_per_node

run_dir = Path(sys.argv[1])
(run_dir / "logs").mkdir(parents=True, exist_ok=True)
cmd = SlurmLauncher(run_dir, None).command(2, None, cpus_per_node())
print(" ".join(cmd), flush=True)
# The replicas' own step and the shell around each task, with a probe in place of the worker.
probe = "import os, sys; print(os.environ['SLURM_CPUS_PER_TASK'], os.environ['SLURMD_NODENAME'], *sys.argv[1:])"
subprocess.run(cmd[:cmd.index(sys.executable)] + [sys.executable, "-c", probe], check=True)
"""


@pytest.mark.parametrize("memory", [["--mem=0"], ["--mem-per-cpu=100", "--cpus-per-task=1"]],
                         ids=["whole-nodes", "users-memory-per-cpu"])
def test_replica_steps_ask_for_their_nodes_cpus_and_memory(slurm_cluster, tmp_path, memory):
    """The replicas' real job step, started with the launcher's srun command inside a
    whole-node job: one task per node, each told its replica index; with the user's memory
    per CPU it asks for no --mem, which srun would refuse."""
    (tmp_path / "probe.py").write_text(PROBE)
    run_dir = tmp_path / "run"
    done = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--exclusive", *memory,
                           f"--output={tmp_path}/job.out",
                           f"--wrap={sys.executable} {tmp_path}/probe.py {run_dir}"],
                          env=slurm_cluster, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    assert wait_job(job, slurm_cluster, timeout=600) == "COMPLETED", (tmp_path / "job.out").read_text()
    out = (tmp_path / "job.out").read_text()
    assert out.count("--cpus-per-task=1") == 1 and "--ntasks=2 --ntasks-per-node=1" in out
    assert out.count("--mem=0") == (1 if memory == ["--mem=0"] else 0)
    logs = sorted((run_dir / "logs").glob("replica-*.log"))
    assert [p.read_text().split() for p in logs] == [["1", "n1", "--replica-index", "0"],
                                                     ["1", "n2", "--replica-index", "1"]]
    assert [p.read_text() for p in sorted((run_dir / "logs").glob("replica-*.exit"))] == \
        ["0\n", "0\n"]


STEP = """
import sys, time
from pathlib import Path
from automlperf.runner.slurm import SlurmLauncher

run_dir = Path(sys.argv[1])
task = (f"import sys, time, pathlib; i = int(sys.argv[-1]); "
        f"sys.exit(3) if i == 1 else None; "
        f"[time.sleep(0.1) for _ in iter(lambda: pathlib.Path('{run_dir}/release').exists(), True)]")
launcher = SlurmLauncher(run_dir, None, worker=[sys.executable, "-c", task])
launcher.start()
deadline = time.monotonic() + 300  # a guard: three tasks start in seconds when idle
while launcher.states() != ["up", "exited"]:
    assert time.monotonic() < deadline, launcher.states()
    time.sleep(0.2)
print("one ended:", launcher.states(), [p.poll() for p in launcher.procs], flush=True)
(run_dir / "release").touch()
assert launcher.procs[0].wait(300) == 0
print("all ended:", launcher.states(), [p.poll() for p in launcher.procs], flush=True)
launcher.stop(10)
"""


def test_one_step_starts_every_replica_and_one_that_exits_leaves_the_others(slurm_cluster,
                                                                           tmp_path):
    """The launcher's own step in a two-node job, with a stand-in for the worker: replica 1
    exits with status 3 at once; the launcher sees it ended while 0 runs on, and 0's exit
    once it is let go (not an earlier session's status); the step (one srun) ends with it."""
    (tmp_path / "step.py").write_text(STEP)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "replica-0.exit").write_text("7\n")  # an earlier session's
    done = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--no-kill",
                           f"--output={tmp_path}/job.out",
                           f"--wrap={sys.executable} {tmp_path}/step.py {run_dir}"],
                          env=slurm_cluster, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    state = wait_job(job, slurm_cluster, timeout=600)
    out = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", out
    assert "one ended: ['up', 'exited'] [None, 3]" in out
    assert "all ended: ['exited', 'exited'] [0, 3]" in out
    srun = (run_dir / "logs" / "srun.log").read_text()
    assert "task 1: Exited with exit code 3" in srun


def test_a_script_with_the_users_memory_is_valid_for_sbatch(slurm_cluster, tmp_path):
    for name, args in (("m", ["--sbatch=--mem-per-cpu=100"]), ("s", ["--shared-nodes"])):
        done = cli("slurm", "--nodes", 2, "--duration", "1h", "--run-dir", tmp_path / name,
                   "--small-task", "--test-only", *args, env=slurm_cluster)
        assert done.returncode == 0, done.stderr
        assert "to start at" in done.stdout


def test_the_script_asks_for_whole_nodes(tmp_path):
    from automlperf.runner.sbatch import ScriptOptions, write_script

    def script(name, *args):
        done = cli("slurm", "--nodes", 2, "--duration", "1h", "--run-dir", tmp_path / name,
                   "--store", "postgresql://u@db/x", "--small-task", *args)
        assert done.returncode == 0, done.stderr
        return (tmp_path / name / "automlperf.sbatch").read_text()

    text = script("r")
    assert "#SBATCH --exclusive" in text and "#SBATCH --mem=0" in text
    shared = script("s", "--shared-nodes", "--cpus-per-task", 4)
    assert "--exclusive" not in shared and "--mem=0" not in shared
    assert "#SBATCH --cpus-per-task=4" in shared
    # Memory the user sets replaces --mem=0, which sbatch refuses beside it.
    for extra in ("--mem-per-cpu=2G", "--mem-per-gpu=40G", "--mem 100G"):
        text = script(f"m{len(extra)}", f"--sbatch={extra}")
        assert "#SBATCH --exclusive" in text and f"#SBATCH {extra}" in text
        assert "--mem=0" not in text
    assert write_script(ScriptOptions(tmp_path / "q", nodes=1, duration_s=3600,
                                      store_url="postgresql://u@db/x",
                                      sbatch_extra=["--qos=high"])).read_text().count("--mem=0") == 1


def test_replica_steps_keep_the_users_cpus_and_memory(tmp_path):
    from automlperf.runner.slurm import SlurmLauncher

    launcher = SlurmLauncher(tmp_path, None)
    alike = launcher.command(2, None, [72, 72], env={})
    assert alike.count("--mem=0") == 1 and "--cpus-per-task=72" in alike
    # Nodes of different sizes: one count would hold every task to the smallest.
    unlike = launcher.command(2, None, [72, 36], env={})
    assert "--whole" in unlike and not any(a.startswith("--cpus") for a in unlike)
    mine = launcher.command(2, "8", [72, 36], env={"SLURM_CPUS_PER_TASK": "16",
                                                   "SLURM_MEM_PER_CPU": "2048"})
    assert "--cpus-per-task=16" in mine and not any(a.startswith("--mem") for a in mine)
    assert "--gpus-per-node=8" in mine and "--whole" not in mine
    per_gpu = launcher.command(1, "8", [72], env={"SLURM_MEM_PER_GPU": "40960"})
    assert not any(a.startswith("--mem") for a in per_gpu)


HOLD = """#!/bin/bash
{python} -m automlperf.store.pgserver start --dir {folder} > {folder}/url || exit 1
touch {folder}/up
while [ ! -e {folder}/release ]; do sleep 0.2; done
# Its node dies: the postmaster with it, and postmaster.pid stays on the shared folder.
kill -9 "$(head -1 {folder}/pgdata/postmaster.pid)"
"""


def test_a_store_is_refused_to_other_hosts_while_its_job_runs_and_taken_over_once_it_ended(
        slurm_cluster, tmp_path):
    """The private server's folder records the job that started it: another host (a second
    submission, a resume on another node) refuses to start a server on it while SLURM says
    that job runs, and recovers it (stale postmaster.pid and all) once the job has ended."""
    import tempfile

    from automlperf.store import pgowner
    from pghost import pgserver_on, rows, with_password, write_rows

    folder = Path(tempfile.mkdtemp(prefix="amp-pgjob-")) / "postgres"
    folder.mkdir()
    try:
        script = tmp_path / "hold.sh"
        script.write_text(HOLD.format(python=sys.executable, folder=folder))
        job = subprocess.run(["sbatch", "--parsable", "-w", "n1", "-o", str(tmp_path / "hold.out"),
                              str(script)], env=slurm_cluster, capture_output=True, text=True,
                             check=True).stdout.strip().split(";")[0]
        deadline = time.monotonic() + 600
        while not (folder / "up").exists():
            assert time.monotonic() < deadline, (tmp_path / "hold.out").read_text()
            time.sleep(0.2)
        owner = pgowner.read_owner(folder)
        assert (owner.job, owner.node) == (job, "n1")
        write_rows(with_password(folder, (folder / "url").read_text()), 7)
        # What reads a run's store afterwards (check, report, slurm --resume) names where it
        # is served, rather than wait for a server it cannot reach.
        from automlperf.store.rundir import RunDir

        RunDir(folder.parent).write_meta(1, (folder / "url").read_text().strip(), "held")
        report = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname login && exec "$@"',
                                 "sh", sys.executable, "-m", "automlperf.cli", "report",
                                 str(folder.parent)], env=slurm_cluster,
                                capture_output=True, text=True, timeout=300)
        assert report.returncode == 2 and len(report.stderr.strip().splitlines()) == 1
        assert f"served from host {socket.gethostname()}, node n1, SLURM job {job}" in report.stderr
        refused = pgserver_on("other-node", folder, slurm_cluster)
        assert refused.returncode == 1, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert f"SLURM job {job} still runs" in refused.stderr
        assert "would corrupt it" in refused.stderr
        (folder / "release").touch()
        assert wait_job(job, slurm_cluster) == "COMPLETED"
        assert (folder / "pgdata" / "postmaster.pid").exists()
        # Its lock file removed, the start pauses for a postmaster cut off from its job to
        # notice (70 s by default; a second here) and says so.
        taken = pgserver_on("other-node", folder, dict(slurm_cluster,
                                                      AUTOMLPERF_STORE_FENCE_S="1"))
        assert taken.returncode == 0, taken.stderr
        assert (f"removed the postmaster.pid left by host {socket.gethostname()}, node n1, "
                f"SLURM job {job} (SLURM job {job} has ended): waiting 1 s") in taken.stderr
        assert rows(with_password(folder, taken.stdout)) == [(7,)]
        assert pgserver_on("other-node", folder, slurm_cluster, "stop").returncode == 0
        assert [p.name for p in folder.glob("owner.json.gone-*")]
    finally:
        subprocess.run(["scancel", job], env=slurm_cluster)
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_a_staged_jobs_time_limit_holds_the_staging_and_so_does_its_resubmission(tmp_path):
    from trees import make_tree

    data = make_tree(tmp_path / "imagenet", per_class=(1, 1))
    run_dir = tmp_path / "r"
    result = slurm_cli("--nodes", 2, "--duration", "1h", "--dataset", "imagenet", "--data-dir",
                       data, "--unofficial", "--run-dir", run_dir, "--store",
                       "postgresql://u@db/x", "--stage-to", "local-scratch", "--stage-time", "30m")
    assert result.exit_code == 0, result.output
    assert "start-up 35 min" in result.output
    script = (run_dir / "automlperf.sbatch").read_text()
    # 5 + 30 min before the clock, the hour, its 15-minute grace, the lead and SLURM's minute.
    assert "#SBATCH --time=1:54:00" in script
    assert f"--to {Path('local-scratch').resolve()}" in script  # where the job runs, absolute
    # Its own step: a node that fails costs only its staging, the slowest node is waited for
    # within the 30 minutes, on two CPUs of its own.
    (step,) = [" ".join(line.split()) for line in script.replace("\\\n", " ").splitlines()
               if "automlperf-stage " in line]
    assert all(flag in step for flag in ("--no-kill", "--wait=0", '--time="$stage_minutes"',
                                         '--cpus-per-task="$stage_cpus"', "--exact")), step
    # 30 minutes, unless a resubmission gives the job another allowance (runner/resubmit.py).
    assert 'stage_s="${AUTOMLPERF_STAGE_S:-1800}"' in script
    assert 'stage_minutes=$(( (stage_s + 59) / 60 ))' in script
    assert 'stage_cpus=$(( ${SLURM_CPUS_ON_NODE:-1} < 2 ? ${SLURM_CPUS_ON_NODE:-1} : 2 ))' in script
    resumed = slurm_cli("--resume", "--run-dir", run_dir)
    assert resumed.exit_code == 0 and "time limit 1:54:00" in resumed.output, resumed.output
    refused = slurm_cli("--nodes", 1, "--run-dir", tmp_path / "s", "--store", "postgresql://u@db/x",
                        "--stage-to", "/local", "--small-task")
    assert refused.exit_code == 2 and "--stage-to copies the dataset" in refused.output
    # A --time-limit that holds the run but not its staging is refused at submission.
    short = slurm_cli("--nodes", 2, "--duration", "1h", "--dataset", "imagenet", "--data-dir",
                      data, "--unofficial", "--run-dir", tmp_path / "t", "--store",
                      "postgresql://u@db/x", "--stage-to", "local-scratch", "--stage-time", "30m",
                      "--time-limit", "1h30m")
    text = " ".join(short.output.split())
    assert short.exit_code == 2 and "needs at least 1:48:00 (a start-up of 1860 s with the " \
        "data's staging and proof" in text, short.output
