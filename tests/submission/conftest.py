"""The runs and bundles the submission tests share, made once per session on the worker
that runs them all (tests/conftest.py groups these modules with the official-shape run)."""

import pytest

from helpers import cli, sim_config

BUILTIN = """
[run]
duration_s = 900
replicas = 1
max_rounds = 3
heartbeat_s = 1
[data]
dataset = "builtin"
[model]
seed_width = 1
[train]
max_epochs = 2
[search]
tpe_startup_trials = 1
[monitor]
interval_s = 1
ceiling_s = 0.3
"""


@pytest.fixture(scope="session")
def builtin_run(tmp_path_factory):
    """A real run on the built-in dataset: three trials (the seed and two children), of the
    seed at its narrow width (a quarter of the default task's channels: the bundle's checks
    read the same records, for about a quarter of the CPU time)."""
    base = tmp_path_factory.mktemp("builtin")
    (base / "c.toml").write_text(BUILTIN)
    done = cli("run", "--config", base / "c.toml", "--run-dir", base / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    return base / "run"


@pytest.fixture(scope="session")
def bundle_dir(builtin_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "builtin"
    done = cli("submit", builtin_run, "--dir", "--out", out, "--org", "Test Site",
               "--system", "Test Laptop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bundle:" in done.stdout and "verify it with: automlperf check" in done.stdout
    return out


@pytest.fixture(scope="session")
def bundle_tgz(builtin_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("archives") / "builtin.tar.gz"
    done = cli("submit", builtin_run, "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="session")
def simulated_bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("simulated")
    (base / "sim.toml").write_text(sim_config(sustained_ops=2e11, lease_timeout_s=600,
                                              max_rounds=2, replicas=1, duration_s=900))
    done = cli("run", "--config", base / "sim.toml", "--run-dir", base / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    done = cli("submit", base / "run", "--dir", "--out", base / "bundle")
    assert done.returncode == 0, done.stdout + done.stderr
    return base / "bundle"


@pytest.fixture(scope="session")
def official_bundle(official_shape_run, tmp_path_factory):
    """The official-shape run's bundle (a folder), as `automlperf submit` writes it. Read it,
    never write: a test copies it (helpers.copy_of) to edit."""
    out = tmp_path_factory.mktemp("official-bundle") / "official-shape"
    done = cli("submit", official_shape_run, "--dir", "--out", out, "--system", "Shape [x1]")
    assert done.returncode == 0, done.stdout + done.stderr
    return out
