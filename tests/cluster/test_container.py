"""Replica steps in a container, configured once by `automlperf slurm`: the script and the
srun command lines it leads to (no container runtime runs here)."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.runner.slurm import Container, SlurmError, SlurmLauncher


def write(tmp_path, *extra):
    run_dir = tmp_path / "r"
    tmp_path.mkdir(exist_ok=True)
    done = CliRunner().invoke(app, ["slurm", "--nodes", "2", "--duration", "2h", "--run-dir",
                                    str(run_dir), "--store", "postgresql://u@db/x", "--small-task", *extra])
    return run_dir, done


def srun_available():
    if shutil.which("srun") is None:
        pytest.fail("srun is not installed (run scripts/setup-system.sh)")


def test_pyxis_steps_mount_the_run_directory_and_run_the_images_python(tmp_path):
    srun_available()
    run_dir, done = write(tmp_path, "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3",
                          "--container-mount", "/data/imagenet:/data/imagenet")
    assert done.exit_code == 0, done.output
    saved = json.loads((run_dir / "container.json").read_text())
    assert saved["runtime"] == "pyxis" and saved["image"] == "nvcr.io#nvidia/pytorch:25.01-py3"
    assert saved["digest"] is None and "named by a tag alone; pin it by digest" in \
        " ".join(done.output.split())
    pinned = "nvcr.io#nvidia/pytorch@sha256:" + "ab" * 32
    run_dir, done = write(tmp_path / "pinned", "--container-image", pinned)
    assert done.exit_code == 0 and f"digest sha256:{'ab' * 32}" in done.output, done.output
    run_dir, done = write(tmp_path, "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3",
                          "--container-mount", "/data/imagenet:/data/imagenet")
    script = (run_dir / "automlperf.sbatch").read_text()
    assert "each step runs in the container nvcr.io#nvidia/pytorch:25.01-py3 (pyxis" in script
    assert "/data/imagenet:/data/imagenet mounted" in script
    step = SlurmLauncher(run_dir.resolve(), None).command(2, "4", env={"SLURM_JOB_ID": "4711"})
    assert "--ntasks=2" in step and "--gpus-per-node=4" in step
    assert f"--container-mounts={run_dir.resolve()}:{run_dir.resolve()},/data/imagenet:/data/imagenet" \
        in step
    # The container made on every node before the clock, found by its name: the job's own, so
    # that a container pyxis kept from another job is never taken for this run's image.
    assert "--container-name=automlperf-4711" in step
    assert ("--container-image='nvcr.io#nvidia/pytorch:25.01-py3' "
            "--container-name=automlperf-$SLURM_JOB_ID true") in script
    shell = step.index("sh")
    assert all(a.startswith("--") for a in step[1:shell])  # srun's options, then the command
    # The task's shell, in the image, gives the worker its rank and keeps its exit status.
    assert step[shell:shell + 2] == ["sh", "-c"] and "$SLURM_PROCID" in step[shell + 2]
    assert step[shell + 4:shell + 8] == ["python3", "-m", "automlperf.cli", "worker"]


def test_apptainer_steps_wrap_the_worker_in_apptainer_exec(tmp_path):
    srun_available()
    run_dir, done = write(tmp_path, "--container-image", "/sw/automlperf.sif",
                          "--container-runtime", "apptainer", "--container-option=--nv")
    assert done.exit_code == 0, done.output
    cmd = SlurmLauncher(run_dir.resolve(), None).command(1, None)
    at = cmd.index("apptainer")
    assert cmd[at - 4:at - 2] == ["sh", "-c"]  # the task's shell on the host, around the image
    assert "--container-name" not in " ".join(cmd) and "container-image" not in \
        (run_dir / "automlperf.sbatch").read_text()
    assert cmd[at:at + 5] == ["apptainer", "exec", "--nv", "--bind",
                              f"{run_dir.resolve()}:{run_dir.resolve()}"]
    assert cmd[at + 5:at + 8] == ["/sw/automlperf.sif", "python3", "-m"]


def test_without_a_container_the_steps_run_the_hosts_python(tmp_path):
    srun_available()
    run_dir, done = write(tmp_path)
    assert done.exit_code == 0 and not (run_dir / "container.json").exists()
    cmd = SlurmLauncher(run_dir.resolve(), None).command(1, None)
    assert "apptainer" not in cmd and not any(a.startswith("--container") for a in cmd)


def test_bad_container_settings_are_refused_in_one_line(tmp_path):
    _, done = write(tmp_path, "--container-image", "x.sif", "--container-runtime", "docker")
    assert done.exit_code == 2 and "container runtime 'docker' is not one of pyxis, apptainer" \
        in done.output
    _, done = write(tmp_path, "--container-mount", "/a:/a")
    assert done.exit_code == 2 and "need --container-image" in done.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "container.json").write_text("{\"runtime\": 1")
    with pytest.raises(SlurmError, match="damaged"):
        Container.load(tmp_path / "bad")


@pytest.mark.slurm
@pytest.mark.slow
def test_the_container_script_is_valid_for_sbatch(slurm_cluster, tmp_path):
    from helpers import cli

    done = cli("slurm", "--nodes", 2, "--duration", "2h", "--run-dir", tmp_path / "r",
               "--container-image", "/sw/automlperf.sif", "--container-runtime", "apptainer",
               "--small-task", "--test-only", env=slurm_cluster)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stdout


def test_the_images_hold_what_installing_automlperf_needs(tmp_path):
    """examples/container/Dockerfile (for pyxis through enroot, Docker, Kubernetes) and
    examples/apptainer/automlperf.def copy the same files and run the same install: the
    files copied are enough to build automlperf, and the build is the package the image
    then imports. No container runtime runs here: the copy and the build do."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    docker = (repo / "examples/container/Dockerfile").read_text()
    definition = (repo / "examples/apptainer/automlperf.def").read_text()
    copied = re.findall(r"^COPY (.+) /opt/automlperf/", docker, re.M)
    names = [n for line in copied for n in line.split()]
    assert sorted(names) == sorted(re.findall(r"^\s+(\S+) /opt/automlperf/\S+$", definition, re.M))
    install = 'python3 -m pip install --no-cache-dir --constraint /tmp/keep-torch.txt "/opt/automlperf[postgres]"'
    assert install in docker and install in definition
    assert docker.splitlines()[docker.splitlines().index(next(
        line for line in docker.splitlines() if line.startswith("FROM")))].split()[1] == \
        re.search(r"^From: (\S+)", definition, re.M).group(1).replace("docker://", "")
    opt = tmp_path / "opt" / "automlperf"
    opt.mkdir(parents=True)
    for name in names:
        source = repo / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, opt / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "wheel"), str(opt)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    wheel = next((tmp_path / "wheel").glob("automlperf-*.whl"))
    import zipfile

    inside = zipfile.ZipFile(wheel).namelist()
    assert "automlperf/presets/official.toml" in inside and "automlperf/runner/sbatch.sh.j2" in inside


def test_a_mount_maps_host_paths_into_the_image_through_their_links(tmp_path):
    real = tmp_path / "lustre" / "datasets"
    (real / "imagenet" / "train").mkdir(parents=True)
    (tmp_path / "shared").symlink_to(real)
    run_dir = tmp_path / "run"
    box = Container("pyxis", "img", [f"{tmp_path / 'shared'}:/data:ro",
                                     f"{real / 'imagenet' / 'train'}:/train"])
    # The login node resolves the typed path; the mount keeps it: both reach the image.
    assert box.inside(run_dir, real / "imagenet") == Path("/data/imagenet")
    assert box.inside(run_dir, tmp_path / "shared" / "imagenet") == Path("/data/imagenet")
    assert box.inside(run_dir, real / "imagenet" / "train" / "n1") == Path("/train/n1")  # deepest
    assert box.inside(run_dir, run_dir / "data") == run_dir / "data"  # the run dir: same path
    assert box.inside(run_dir, tmp_path / "elsewhere") is None
    assert Container("apptainer", "x.sif", ["/scratch"]).inside(run_dir, Path("/scratch/a")) == \
        Path("/scratch/a")  # apptainer's source-only bind keeps the path


def test_the_replicas_read_the_data_where_the_image_mounts_it(tmp_path):
    """`--data-dir` typed through a link (resolved on the login node) and mounted at /data:
    each step's worker is told to read /data/imagenet; a folder no mount holds, or staging
    the image cannot see, is refused in one line before anything is written."""
    srun_available()
    from trees import WNIDS, make_tree

    make_tree(tmp_path / "lustre" / "imagenet", per_class=(2, 1), classes=WNIDS[:4])
    (tmp_path / "shared").symlink_to(tmp_path / "lustre")
    typed = tmp_path / "shared" / "imagenet"
    args = ["--dataset", "imagenet", "--data-dir", str(typed), "--unofficial",
            "--container-image", "/sw/automlperf.sif", "--container-runtime", "apptainer"]
    run_dir, done = write(tmp_path, *args, "--container-mount", f"{typed}:/data/imagenet:ro")
    assert done.exit_code == 0, done.output
    assert json.loads((run_dir / "container.json").read_text())["data_root"] == "/data/imagenet"
    cmd = SlurmLauncher(run_dir.resolve(), None).command(1, None)
    assert cmd[cmd.index("--data-root") + 1] == "/data/imagenet" and cmd[-2] == "--data-root"
    assert "the replicas reading the dataset at /data/imagenet in it" in \
        (run_dir / "automlperf.sbatch").read_text()
    _, done = write(tmp_path / "b", *args)
    assert done.exit_code == 2 and "is not mounted in the container: add --container-mount " \
        f"{(tmp_path / 'lustre' / 'imagenet')}:/data" in " ".join(done.output.split())
    _, done = write(tmp_path / "c", *args, "--container-mount", f"{typed}:/data/imagenet",
                    "--stage-to", "/local/scratch")
    assert done.exit_code == 2 and "--stage-to /local/scratch is not mounted at the same path" \
        in " ".join(done.output.split())
