"""Simulated runs end to end: a benchmark of simulated accelerators submitted to a real
SLURM cluster of eight slurmd nodes, and weak scaling across simulated runs of different
sizes. Everything but the accelerators is real (primary, replicas, search, TPE, PostgreSQL
or SQLite, monitor, score, check, report); the runs end by `run.max_rounds`."""

import json
import re
import shutil

import pytest

from helpers import cli, sim_config
from test_slurm import stored, wait_job

pytestmark = pytest.mark.slow


def runs_config(rounds, **run) -> str:
    """Simulated devices sustaining a modest rate, so that an epoch of the small seed on the
    digits lasts a fraction of a second (its operations counted, as always)."""
    return sim_config(sustained_ops=2e11, lease_timeout_s=600, max_rounds=rounds, **run)



@pytest.mark.slurm
def test_a_simulated_run_on_eight_slurm_nodes_completes_verifies_and_is_labelled(
        slurm_cluster_8, tmp_path):
    env = slurm_cluster_8
    run_dir = tmp_path / "run"
    (tmp_path / "sim.toml").write_text(runs_config(2))
    done = cli("slurm", "--nodes", 8, "--duration", "15m", "--run-dir", run_dir,
               "--config", tmp_path / "sim.toml", "--submit", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    state = wait_job(job, env)
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    assert state == "COMPLETED", out[-3000:]
    assert "automlperf primary finished with status 0" in out
    trials, epochs = stored(run_dir)
    assert {t.replica_index for t in trials} == set(range(8))
    assert all(t.status == "completed" for t in trials) and len(trials) == 16
    assert {e.trial_id for e in epochs} == {t.id for t in trials}
    result = json.loads((run_dir / "result.json").read_text())
    assert result["replicas"] == 8 and result["devices"] == 8 and result["score"] > 0
    assert result["simulated"] is True and result["simulation"]["sustained_ops_per_device"] == 2e11
    assert result["valid"] is False and result["official"] is False
    assert result["violations"][0]["rule"] == "simulated"
    # No real accelerator is claimed: system.json describes the simulated devices.
    system = json.loads((run_dir / "system.json").read_text())
    assert system["simulated"] and system["slurm"]["SLURM_JOB_NUM_NODES"] == "8"
    assert all(a["simulated"] and a["name"].startswith("simulated accelerator")
               for a in system["accelerators"])
    assert result["system"]["accelerators"] == [system["accelerators"][0]["name"]]
    html = (run_dir / "report.html").read_text()
    assert "SIMULATED RUN: these figures are not measurements." in html
    # check recounts every epoch's operations from the graphs and trial logs; --official
    # refuses the result in one line.
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
    assert "SIMULATED" in done.stdout
    done = cli("check", run_dir, "--official", timeout=300)
    assert done.returncode == 3
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("refused: a simulated run is never an official result")


def local_run(tmp_path, name, replicas, config):
    (tmp_path / f"{name}.toml").write_text(config)
    run_dir = tmp_path / name
    done = cli("run", "--config", tmp_path / f"{name}.toml", "--replicas", replicas,
               "--duration", "15m", "--run-dir", run_dir, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_dir


def test_weak_scaling_of_simulated_runs_and_the_mixes_it_refuses(tmp_path):
    one = local_run(tmp_path, "one", 1, runs_config(2))
    four = local_run(tmp_path, "four", 4, runs_config(2))
    page = tmp_path / "scaling.html"
    done = cli("compare", "--scaling", four, one, "--html", page, "--json")
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    results = [json.loads((d / "result.json").read_text()) for d in (one, four)]
    assert [r["devices"] for r in runs] == [1, 4]  # smallest first
    base = results[0]["ops_per_s_per_device"]
    assert runs[0]["efficiency"] == 1.0
    assert runs[1]["efficiency"] == pytest.approx(results[1]["ops_per_s_per_device"] / base)
    assert all(r["simulated"] for r in runs)
    html = page.read_text()
    assert "<svg" in html and "SIMULATED RUNS: these figures are not measurements." in html
    done = cli("compare", "--scaling", one, four, "--html", page)
    assert done.returncode == 0 and "efficiency" in done.stdout and "SIMULATED" in done.stdout
    # The ranking marks them too.
    done = cli("compare", one, four, "--json")
    assert done.returncode == 0 and all(r["simulated"] for r in json.loads(done.stdout))
    done = cli("compare", one, four)
    assert done.returncode == 0 and "SIMULATED: runs marked so" in done.stdout

    measured = local_run(tmp_path, "measured", 1, runs_config(1, accelerator="real"))
    assert json.loads((measured / "result.json").read_text())["simulated"] is False
    done = cli("compare", "--scaling", one, measured, "--html", page)
    assert done.returncode == 2
    assert "cannot compare the scaling of simulated runs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = cli("compare", "--scaling", one, "--html", page)
    assert done.returncode == 2 and "at least two runs" in done.stderr
    done = cli("compare", "--scaling", one, one, "--html", page)
    assert done.returncode == 2 and "give runs of different sizes" in done.stderr
    # Measured runs on different accelerators measure different machines.
    other = tmp_path / "other"
    shutil.copytree(measured, other)
    system = json.loads((other / "system.json").read_text())
    system["accelerators"] = [{"index": 0, "name": "another accelerator"}]
    (other / "system.json").write_text(json.dumps(system))
    done = cli("compare", "--scaling", measured, other, "--html", page)
    assert done.returncode == 2 and "different accelerators" in done.stderr
    # A simulated run whose result.json was edited to look measured is still marked.
    edited = tmp_path / "edited"
    shutil.copytree(one, edited)
    result = json.loads((edited / "result.json").read_text())
    result["simulated"] = False
    (edited / "result.json").write_text(json.dumps(result))
    done = cli("compare", edited, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)[0]["simulated"] is True
