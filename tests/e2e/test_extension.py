"""A run extended after it ran: `automlperf run --resume --duration LONGER` makes it a run of
the new length, recorded as such, scored as such, and verified by `check`. Simulated
accelerators on the digits: the run's clock is real, its work is modelled."""

import json

import pytest

from automlperf.store import open_store
from helpers import cli, sim_config

pytestmark = pytest.mark.slow


def test_a_finished_run_is_extended_to_a_longer_one(tmp_path):
    config = tmp_path / "sim.toml"
    config.write_text(sim_config(sustained_ops=2e10, deadline_grace_s=1, stop_grace_s=10))
    run_dir = tmp_path / "run"
    done = cli("run", "--config", config, "--duration", "6s", "--run-dir", run_dir, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    first = json.loads((run_dir / "result.json").read_text())
    assert first["duration_s"] == 6 and first["extensions"] == []
    before = _epochs(run_dir)

    shorter = cli("run", "--resume", "--run-dir", run_dir, "--duration", "5s")
    assert shorter.returncode == 2, shorter.stdout + shorter.stderr
    assert "--duration 0:00:05 does not extend this run, which lasts 0:00:06" in shorter.stderr
    assert json.loads((run_dir / "result.json").read_text()) == first

    done = cli("run", "--resume", "--run-dir", run_dir, "--duration", "12s", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the run now lasts 0:00:12: 0:00:06 more" in done.stderr
    second = json.loads((run_dir / "result.json").read_text())
    assert second["duration_s"] == 12 and len(second["segments"]) == 2
    assert second["elapsed_s"] == pytest.approx(12, abs=1e-6)
    (extension,) = second["extensions"]
    assert (extension["from_s"], extension["to_s"]) == (6, 12)
    assert extension["done_s"] == pytest.approx(first["elapsed_s"], abs=1e-3)
    assert json.loads((run_dir / "system.json").read_text())["extensions"] == [extension]
    assert "duration_s = 12.0" in (run_dir / "config.toml").read_text()
    # Everything of the first part stays, and the score counts what the extension added (how
    # much that is depends on how fast the replicas start again, so its amount is not fixed).
    # `check` below recomputes the score from the records.
    assert before.items() <= _epochs(run_dir).items() and second["trials"] >= first["trials"]
    assert second["epochs"] >= first["epochs"] and second["total_ops"] >= first["total_ops"]
    assert (second["epochs"] > first["epochs"]) == (second["total_ops"] > first["total_ops"])
    # Each session's primary timed its stop, from the deadline's epochs drained to its result
    # and report written: what a chain's later jobs are given as their lead.
    from automlperf.runner.joblimits import FINISH_LOG

    stops = [json.loads(line) for line in (run_dir / "logs" / FINISH_LOG).read_text().splitlines()]
    assert [s["segment"] for s in stops] == [0, 1] and all(s["finish_s"] > 0 for s in stops)
    checked = cli("check", run_dir, timeout=300)
    assert checked.returncode == 0 and "verified" in checked.stdout, checked.stdout + checked.stderr


def _epochs(run_dir) -> dict:
    """(trial, epoch) → (operations, end) of each stored epoch."""
    store = open_store(run_dir=run_dir)
    try:
        return {(e.trial_id, e.epoch): (e.ops, e.ended_at) for e in store.epochs(1)}
    finally:
        store.close()
