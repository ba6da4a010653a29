"""What a bundle publishes about the site, and `submit --no-site-details`: the scheduler's
user, account, hosts, cluster and paths recorded by a run are in its bundle by default, and
replaced by neutral names in every file without them; that bundle still verifies."""

import getpass
import json
import os
import re
import socket

import pytest

from helpers import cli, sim_config

pytestmark = pytest.mark.slow

SITE = {"SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "astro42",
        "SLURM_SUBMIT_HOST": "login7.example.org", "SLURM_CLUSTER_NAME": "perlmutter-x",
        "SLURM_SUBMIT_DIR": "/home/alice/benchmarks", "SLURM_JOB_PARTITION": "gpu-large"}


def texts(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.suffix != ".safetensors"}


def test_a_bundle_without_site_details_names_none_and_still_verifies(tmp_path):
    (tmp_path / "sim.toml").write_text(sim_config(max_rounds=2))
    run_dir = tmp_path / "run"
    done = cli("run", "--config", tmp_path / "sim.toml", "--run-dir", run_dir,
               env=dict(os.environ, **SITE))
    assert done.returncode == 0, done.stdout + done.stderr
    kept = tmp_path / "kept"
    assert cli("submit", run_dir, "--dir", "--out", kept).returncode == 0
    published = b"".join(texts(kept).values())
    assert b"alice" in published and b"astro42" in published
    assert socket.gethostname().encode() in published

    bare = tmp_path / "bare"
    done = cli("submit", run_dir, "--dir", "--out", bare, "--no-site-details")
    assert done.returncode == 0, done.stdout + done.stderr
    found = texts(bare)
    for secret in [*SITE.values(), socket.gethostname(), str(run_dir), getpass.getuser()]:
        # As a word: a short host name ("vm") is also a part of other words ("kvm").
        word = re.compile(rf"(?<![\w.-]){re.escape(secret)}(?![\w-])".encode())
        holders = [name for name, text in found.items() if word.search(text)]
        assert not holders, f"{secret!r} still in {holders}"
    system = json.loads(found["system.json"])
    assert system["host"] == "node-1"
    env = system["provenance"]["environment"]
    assert env["SLURM_JOB_USER"] == "user" and env["SLURM_CLUSTER_NAME"] == "cluster"
    assert json.loads(found["result.json"])["nodes"] == 1
    done = cli("check", bare)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
