"""What a bundle publishes about the site, and `submit --no-site-details`: the scheduler's
user, account, hosts, cluster and paths recorded by a run are in its bundle by default, and
replaced by neutral names in every file without them; that bundle still verifies."""

import getpass
import json
import os
import platform
import re
import socket

import pytest

from helpers import cli, sim_config

pytestmark = pytest.mark.slow

SITE = {"SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "astro42",
        "SLURM_SUBMIT_HOST": "login7.example.org", "SLURM_CLUSTER_NAME": "perlmutter-x",
        "SLURM_SUBMIT_DIR": "/home/alice/benchmarks", "SLURM_JOB_PARTITION": "gpu-large",
        "SLURM_JOB_QOS": "astro-premium", "SLURM_JOB_RESERVATION": "alice-resv-0412",
        "SLURM_CONF": "/etc/slurm-perlmutter/slurm.conf", "NCCL_SOCKET_IFNAME": "hsn0site"}


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
    for secret in [*SITE.values(), socket.gethostname(), str(run_dir), getpass.getuser(),
                   platform.release()]:
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


def test_accelerator_uuids_become_neutral_names_the_same_in_every_file(tmp_path):
    """A GPU's UUID names one card of one site: every file that holds it (the node's
    description, its samples, the trial logs) gets the same neutral name, so that the
    samples still find their device."""
    from automlperf.submission.site import leave_out, site_names

    nvml, bare = "GPU-1a2b3c4d-0000-1111-2222-333344445555", "9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"
    (tmp_path / "records").mkdir()
    (tmp_path / "trials" / "3").mkdir(parents=True)
    (tmp_path / "system.json").write_text(json.dumps({"host": "n1", "os": "Linux 6.1.0-site"}))
    (tmp_path / "config.toml").write_text("[run]\n")
    (tmp_path / "records" / "nodes.jsonl").write_text(json.dumps(
        {"host": "n1", "system": {"accelerators": [{"uuid": nvml}, {"uuid": bare}]}}) + "\n")
    (tmp_path / "records" / "samples.jsonl").write_text(json.dumps(
        {"node": "n1", "uuids": [nvml, bare]}) + "\n")
    (tmp_path / "trials" / "3" / "log.jsonl").write_text(f'{{"device": "{nvml}"}}\n')
    names = site_names(tmp_path, tmp_path / "run")
    changed = leave_out(tmp_path, names)
    assert {"records/nodes.jsonl", "records/samples.jsonl", "trials/3/log.jsonl",
            "system.json"} <= set(changed)
    node = json.loads((tmp_path / "records" / "nodes.jsonl").read_text())
    sample = json.loads((tmp_path / "records" / "samples.jsonl").read_text())
    assert [a["uuid"] for a in node["system"]["accelerators"]] == sample["uuids"]
    assert set(sample["uuids"]) == {"GPU-1", "GPU-2"}
    assert "GPU-1" in (tmp_path / "trials" / "3" / "log.jsonl").read_text()
    system = json.loads((tmp_path / "system.json").read_text())
    assert system == {"host": "node-1", "os": "Linux kernel"}


def test_the_replicas_image_path_becomes_a_neutral_name_and_its_digest_stays(tmp_path):
    from automlperf.submission.site import leave_out, site_names

    image = "/projects/site-ai/images/automlperf.sif"
    (tmp_path / "records").mkdir()
    (tmp_path / "system.json").write_text(json.dumps(
        {"host": "n1", "replica_image": {"runtime": "apptainer", "image": image,
                                         "digest": "sha256:" + "ab" * 32}}))
    (tmp_path / "config.toml").write_text("[run]\n")
    (tmp_path / "records" / "nodes.jsonl").write_text(json.dumps(
        {"host": "n1", "software": {"container": {"runtime": "apptainer", "image": image,
                                                  "name": "automlperf.sif"}}}) + "\n")
    leave_out(tmp_path, site_names(tmp_path, tmp_path / "run"))
    system = json.loads((tmp_path / "system.json").read_text())
    node = json.loads((tmp_path / "records" / "nodes.jsonl").read_text())
    assert system["replica_image"] == {"runtime": "apptainer", "image": "IMAGE",
                                       "digest": "sha256:" + "ab" * 32}
    assert node["software"]["container"]["image"] == "IMAGE"


def test_a_sites_own_registry_and_login_become_neutral_names(tmp_path):
    """A pyxis reference names the registry the site runs and the user it logs in as; a
    public registry, the image's name and its digest name no site and stay."""
    from automlperf.submission.site import leave_out, registry_names, site_names

    own = "alice@registry.hpc.example.edu:5000#ai/automlperf:1.2@sha256:" + "cd" * 32
    (tmp_path / "records").mkdir()
    (tmp_path / "system.json").write_text(json.dumps(
        {"host": "n1", "replica_image": {"runtime": "pyxis", "image": own}}))
    (tmp_path / "config.toml").write_text("[run]\n")
    (tmp_path / "records" / "nodes.jsonl").write_text(json.dumps(
        {"host": "n1", "software": {"container": {"runtime": "pyxis", "image": own}}}) + "\n")
    leave_out(tmp_path, site_names(tmp_path, tmp_path / "run"))
    system = json.loads((tmp_path / "system.json").read_text())
    assert system["replica_image"]["image"] == \
        "user@REGISTRY:5000#ai/automlperf:1.2@sha256:" + "cd" * 32
    assert "registry.hpc" not in (tmp_path / "records" / "nodes.jsonl").read_text()
    assert registry_names("nvcr.io#nvidia/pytorch:25.01-py3") == {}
    assert registry_names("docker://ghcr.io/org/automlperf:1") == {}
    assert registry_names("docker://harbor.site.example:443/ai/automlperf") == \
        {"harbor.site.example": "REGISTRY"}
    assert registry_names("ubuntu:24.04") == {}
