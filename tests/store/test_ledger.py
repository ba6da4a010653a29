"""The ledger's comparison of a run's store with its trial logs, on a real store: what it
names and the one difference it leaves to the lease."""

import json

import pytest

from automlperf.store import open_store
from automlperf.store.ledger import compare, read_logs
from helpers import epoch_of, one_trial


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'history.db'}", create=True)
    yield s
    s.close()


def _log(folder, trial_id, epochs, status):
    """Trial ``trial_id``'s log: ``epochs`` epoch lines, then its outcome ``status``."""
    path = folder / str(trial_id)
    path.mkdir(parents=True)
    lines = [{"type": "epoch", "epoch": n} for n in range(epochs)]
    lines.append({"type": "trial", "status": status})
    (path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_an_outcome_the_store_tells_otherwise_is_named(store, tmp_path):
    run_id, trial = one_trial(store)
    store.record_epoch(epoch_of(run_id, trial, 0))
    store.finish_trial(trial, "completed", now=200.0)
    _log(tmp_path, trial, 1, "failed")
    ledger = compare(store.epochs(run_id), store.trials(run_id),
                     read_logs(lambda t: tmp_path / str(t), [trial]))
    assert ledger.outcomes == [(trial, "failed", "completed")] and ledger.lost == 1
    assert ledger.problems() == [f"trial {trial}: its log ends failed, but the store says "
                                 "completed"]


def test_a_trial_the_lease_failed_after_its_log_ended_it_is_not_a_loss(store, tmp_path):
    """Its replica logged the outcome, then was stopped before finishing the trial in the
    store; the lease lapsed and the primary failed it. Every epoch is on both sides."""
    run_id, trial = one_trial(store)
    for n in range(2):
        store.record_epoch(epoch_of(run_id, trial, n))
    assert store.expire_leases(run_id, 10_000.0) == [trial]
    _log(tmp_path, trial, 2, "completed")
    ledger = compare(store.epochs(run_id), store.trials(run_id),
                     read_logs(lambda t: tmp_path / str(t), [trial]))
    assert (ledger.logged, ledger.stored, ledger.lost, ledger.problems()) == (2, 2, 0, [])
    # Failed otherwise (its replica said so): the logged outcome still has to agree.
    other, second = one_trial(store, name="s")
    store.finish_trial(second, "failed", now=200.0, reason="out of memory")
    _log(tmp_path, second, 0, "completed")
    ledger = compare(store.epochs(other), store.trials(other),
                     read_logs(lambda t: tmp_path / str(t), [second]))
    assert ledger.outcomes == [(second, "completed", "failed")]
