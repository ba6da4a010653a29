"""Every command of docs/cluster.md ("Running on a cluster") is the one this test runs: each
`automlperf slurm` line, as written, with the site's paths put in (the run directories, and
the data: ImageNet-1k's three official archives at their real sizes, as sparse files, which
a submission only sees to be there: every session of the job proves them) and without
`--submit`: this machine has no GPUs, partition or account to give the jobs
(tests/cluster/test_slurm.py and the tests named there submit the same scripts to the local
SLURM cluster). `scancel --batch --signal=TERM` and `automlperf slurm --resume ... --submit`
run for real in tests/cluster/test_cluster_clock.py. The same command on a folder of images,
however it was proven, is refused before any script is written, naming the archives."""

import re
import shlex
from pathlib import Path

import pytest

from helpers import cli
from trees import WNIDS, make_tree

pytestmark = pytest.mark.slow

CLUSTER_DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def cluster_commands() -> list[str]:
    text = CLUSTER_DOC.read_text()
    section = text[text.index("# Running on a cluster\n"):]  # the page, its sections included
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("automlperf ")]


# The official archives' sizes, in bytes (image-net.org's ILSVRC-2012 downloads).
SIZES = {"ILSVRC2012_img_train.tar": 147_897_477_120, "ILSVRC2012_img_val.tar": 6_744_924_160,
         "ILSVRC2012_devkit_t12.tar.gz": 2_568_145}


def test_the_readmes_cluster_commands_run_as_written(tmp_path):
    archives = tmp_path / "ilsvrc2012"
    archives.mkdir()
    for name, size in SIZES.items():
        with open(archives / name, "wb") as f:
            f.truncate(size)
    commands = cluster_commands()
    assert len(commands) == 6 and all(c.startswith("automlperf slurm ") for c in commands)
    # The same official command on a folder of images (with the manifest earlier rulesets
    # took for a proof): refused in one line naming the archives, no script written.
    folder = make_tree(tmp_path / "imagenet", classes=WNIDS[:3])
    (folder / "automlperf-manifest.tsv.gz").write_bytes(b"\x1f\x8b")
    argv = shlex.split(commands[0].replace("/shared/datasets/ilsvrc2012", str(folder))
                       .replace("/shared/runs/", f"{tmp_path}/runs/"))[1:-1]
    done = cli(*argv)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "official run refused" in done.stderr and all(n in done.stderr for n in SIZES)
    assert not (tmp_path / "runs" / "cluster-a" / "automlperf.sbatch").exists()
    plans = {}
    written = {}
    for command in commands:
        if "--resume" in command:
            continue
        argv = shlex.split(command.replace("/shared/datasets/ilsvrc2012", str(archives))
                           .replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
        assert argv.pop() == "--submit"
        done = cli(*argv, timeout=900)
        assert done.returncode == 0, command + "\n" + done.stdout + done.stderr
        assert f"dataset: the official archives in {archives} (154.6 GB)" in done.stdout, done.stdout
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        script = (run_dir / "automlperf.sbatch").read_text()
        written[run_dir.name] = script
        plans[run_dir.name] = done.stdout
        assert "#SBATCH --no-kill" in script and "#SBATCH --gpus-per-node=8" in script
        assert not (run_dir / "dataset-index").exists()  # each session's proof makes it
        config = (run_dir / "submitted-config.toml").read_text()
        assert "official = true" in config and f'data_dir = "{archives}"' in config
    assert "#SBATCH --partition=gpu" in written["cluster-a"]
    # The start-up holds 5 minutes and the archives' proof (154.6 GB at 400 MB/s: 387 s).
    assert "#SBATCH --time=2:47:00" in written["cluster-a"]
    assert "# automlperf: start-up allowance 687 s" in written["cluster-a"]
    # Staged on the nodes: a step on every node before the start-up, given the archives'
    # copy at 400 MB/s and their reading back at 1 GB/s, with a quarter more.
    staged = written["cluster-b"]
    assert "#SBATCH --time=2:59:00" in staged and "--to /local/scratch" in staged
    # The store first (a job that may not use it does nothing), then the health sweep, then
    # the staging.
    order = [staged.index(step) for step in ("automlperf.store.pgserver start",
                                             "automlperf.cli sweep", "automlperf.cli stage")]
    assert order == sorted(order)
    assert "# automlperf: staging allowance 677 s" in staged
    assert "#SBATCH --job-name=automlperf-cluster-b" in staged
    # 24 hours and their 6 of grace in jobs of 8: each holds 8 h less 23 min of start-up and
    # staging and 3 min of signal lead and result, 454 min of run; four jobs and a spare.
    assert "#SBATCH --time=8:00:00" in written["long"]
    assert ("a chain of 5 jobs of 8:00:00 (each: start-up 23 min, run 454.3 min, result 3 min"
            in plans["long"])
    assert "#SBATCH --nodes=2" in written["pilot"] and "#SBATCH --time=1:30:00" in written["pilot"]
    resume, = (c for c in commands if "--resume" in c and "--duration" not in c)
    argv = shlex.split(resume.replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
    assert argv.pop() == "--submit"
    done = cli(*argv)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sbatch --time=2:47:00" in done.stdout  # no clock started yet: all of it is left
    # The pilot's extension: these scripts were never submitted, so there is nothing to
    # extend yet (an extension that runs: tests/cluster/test_cluster_clock.py).
    extend, = (c for c in commands if "--resume" in c and "--duration" in c)
    argv = shlex.split(extend.replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
    assert argv.pop() == "--submit" and "pilot" in argv[argv.index("--run-dir") + 1]
    done = cli(*argv)
    assert done.returncode == 2 and "never started its clock" in done.stderr, done.stderr
