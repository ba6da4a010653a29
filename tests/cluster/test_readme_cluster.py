"""Every command of docs/cluster.md ("Running on a cluster") is the one this test runs: each
`automlperf slurm` line, as written, with the site's paths put in (the run directories, and
the data: a tree of ImageNet-1k's 1,000 classes and 1,331,167 files, hard links to one
small JPEG, which the official configuration accepts) and without `--submit`: this machine
has no GPUs, partition or account to give the jobs (tests/cluster/test_slurm.py and the tests named
there submit the same scripts to the local SLURM cluster). `scancel --batch --signal=TERM`
and `automlperf slurm --resume ... --submit` run for real in tests/cluster/test_cluster_clock.py."""

import re
import shlex
from pathlib import Path

import pytest

from helpers import cli

pytestmark = pytest.mark.slow

CLUSTER_DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def cluster_commands() -> list[str]:
    text = CLUSTER_DOC.read_text()
    section = text[text.index("# Running on a cluster\n"):]  # the page, its sections included
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("automlperf ")]


def test_the_readmes_cluster_commands_run_as_written(imagenet_1k_tree, tmp_path):
    imagenet = imagenet_1k_tree
    commands = cluster_commands()
    # The data's proof, once per site: the official archives (144 GB) are not here, so the
    # tree carries the manifest that command writes (trees.write_proof), which each
    # official submission below samples.
    proof = commands.pop(0)
    assert proof.startswith("automlperf verify-data --archives ") and \
        "--data-dir /shared/datasets/imagenet" in proof
    assert (imagenet / "automlperf-manifest.tsv.gz").exists()
    assert len(commands) == 6 and all(c.startswith("automlperf slurm ") for c in commands)
    plans = {}
    written = {}
    for command in commands:
        if "--resume" in command:
            continue
        argv = shlex.split(command.replace("/shared/datasets/imagenet", str(imagenet))
                           .replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
        assert argv.pop() == "--submit"
        done = cli(*argv, timeout=900)
        assert done.returncode == 0, command + "\n" + done.stdout + done.stderr
        assert "dataset: 1,331,167 files scanned in" in done.stdout, done.stdout
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        script = (run_dir / "automlperf.sbatch").read_text()
        written[run_dir.name] = script
        plans[run_dir.name] = done.stdout
        assert "#SBATCH --no-kill" in script and "#SBATCH --gpus-per-node=8" in script
        assert (run_dir / "dataset-index" / "index.json").exists()
        config = (run_dir / "submitted-config.toml").read_text()
        assert "official = true" in config and f'data_dir = "{imagenet}"' in config
    assert "#SBATCH --partition=gpu" in written["cluster-a"]
    assert "#SBATCH --time=2:41:00" in written["cluster-a"]
    # Staged on the nodes: a step on every node before the start-up, given 20 minutes.
    staged = written["cluster-b"]
    assert "#SBATCH --time=3:01:00" in staged and "--to /local/scratch" in staged
    assert staged.index("automlperf.cli stage") < staged.index("automlperf.store.pgserver start")
    assert "# automlperf: staging allowance 1200 s" in staged
    # 24 hours and their 6 of grace in jobs of 8: each holds 8 h less 25 min of start-up and
    # staging and 55 min of signal lead and result, 400 min of run; five jobs and a spare.
    assert "#SBATCH --time=8:00:00" in written["long"]
    assert "a chain of 6 jobs of 8:00:00 (each: start-up 25 min, run 400.0 min" in plans["long"]
    assert "#SBATCH --nodes=2" in written["pilot"] and "#SBATCH --time=1:24:00" in written["pilot"]
    resume, = (c for c in commands if "--resume" in c and "--duration" not in c)
    argv = shlex.split(resume.replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
    assert argv.pop() == "--submit"
    done = cli(*argv)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sbatch --time=2:41:00" in done.stdout  # no clock started yet: all of it is left
    # The pilot's extension: these scripts were never submitted, so there is nothing to
    # extend yet (an extension that runs: tests/cluster/test_cluster_clock.py).
    extend, = (c for c in commands if "--resume" in c and "--duration" in c)
    argv = shlex.split(extend.replace("/shared/runs/", f"{tmp_path}/runs/"))[1:]
    assert argv.pop() == "--submit" and "pilot" in argv[argv.index("--run-dir") + 1]
    done = cli(*argv)
    assert done.returncode == 2 and "never started its clock" in done.stderr, done.stderr
