"""A replica's loop in-process: the real store (SQLite), search and TPE study, with a trainer
that stands in for the accelerators (it reports epochs without training anything)."""

import json
import threading
from pathlib import Path

import pytest

from helpers import make_replica

from automlperf.config import Config
from automlperf.events import EpochEvent, TrialOutcome, TrialStatus, read_jsonl
from automlperf.runner import session as steps
from automlperf.store import open_store
from automlperf.train.spec import TrainerError

DIGITS = {"name": "digits", "classes": 10, "image_size": 8, "channels": 1}


class FakeTrainer:
    """Keeps the Trainer protocol; its accuracy grows with the epochs and the graph's size."""

    world = 1

    def __init__(self, fail: str | None = None, on_epoch=None, lost_after: int | None = None,
                 clock=None, during_epoch=None):
        self.fail = fail
        self.lost_after = lost_after  # trials after which the accelerators cannot come back
        self.on_epoch = on_epoch or (lambda spec, epoch: None)
        # While an epoch trains (a test moves its clock there), and the clock by which no
        # epoch starts after the spec's finish_by, as the real trainer's ranks do.
        self.during_epoch = during_epoch or (lambda spec, epoch: None)
        self.clock = clock
        self.batch_gain = 0.0  # accuracy per image of batch
        self.specs = []
        self.started = self.closed = False

    def start(self):
        self.started = True
        return {"dataset": DIGITS, "devices": ["fake"], "uuids": []}

    def train(self, spec, sink, should_stop=None):
        if self.lost_after is not None and len(self.specs) >= self.lost_after:
            raise TrainerError("the training processes failed to start 3 times in a row; "
                               "the last time: device busy")
        self.specs.append(spec)
        outcome = TrialOutcome(trial_id=spec.trial_id, status="failed", batch_size=spec.batch_size,
                               precision="fp32")
        if self.fail is not None:
            outcome.reason = f"{self.fail}: out of memory allocating 123 MiB"
            outcome.extra["failure"] = self.fail
            return outcome
        layers = len(spec.graph["layers"])
        for epoch in range(spec.epochs):
            late = self.clock is not None and spec.finish_by is not None and \
                self.clock() >= spec.finish_by
            if late or (should_stop is not None and should_stop()):
                outcome.status, outcome.reason = "stopped", "deadline reached"
                return outcome
            self.during_epoch(spec, epoch)
            if should_stop is not None and should_stop():  # the epoch in flight is lost
                outcome.status, outcome.reason = "stopped", "deadline reached"
                return outcome
            accuracy = min(0.99, 0.3 + 0.1 * epoch + 0.001 * layers + self.batch_gain * spec.batch_size)
            sink.epoch(EpochEvent(
                trial_id=spec.trial_id, epoch=spec.first_epoch + epoch, started_at=1.0 + epoch,
                ended_at=2.0 + epoch,
                train_images=1000, val_images=200, steps=8, ops=10**9, train_loss=1.0,
                val_accuracy=accuracy, precision="fp32", batch_size=spec.batch_size,
                world_size=1, data_share=0.1, images_per_s=1000.0))
            outcome.epochs = epoch + 1
            if accuracy > max(spec.save_above, outcome.best_accuracy or -1.0):
                outcome.best_accuracy, outcome.best_epoch = accuracy, spec.first_epoch + epoch
                Path(spec.weights_out).write_bytes(b"weights of the best epoch")
            self.on_epoch(spec, epoch)
        outcome.status = "completed"
        return outcome

    def close(self):
        self.closed = True

    def kill(self):
        self.closed = True


def new_run(tmp_path, search="", **run):
    settings = {"heartbeat_s": 1, "lease_timeout_s": 600, "max_rounds": 5, **run}
    text = "[run]\n" + "".join(f"{k} = {v!r}\n" for k, v in settings.items()) + """
[data]
dataset = "digits"
image_size = 8
[train]
max_epochs = 2
batch_size = 64
[search]
tpe_startup_trials = 1
candidates_per_generation = 16
""" + search
    (tmp_path / "config.toml").write_text(text)
    config = Config.load(tmp_path / "config.toml")
    session = steps.prepare(config, tmp_path / "run", None, False, {})
    session.store.close()
    return session


def test_the_loop_searches_records_and_tunes(tmp_path):
    session = new_run(tmp_path)
    trainer = FakeTrainer()
    replica, store = make_replica(session, trainer)
    assert replica.run() == 0
    assert trainer.started and trainer.closed
    trials = store.trials(session.run_id)
    assert [t.round for t in trials] == [0, 1, 2, 3, 4]
    assert all(t.status == TrialStatus.COMPLETED for t in trials)
    config = session.config
    for t, spec in zip(trials, trainer.specs):
        assert spec.trial_id == t.id and spec.epochs == config.train.round_epochs(t.round)
        assert t.hparams["epochs"] == spec.epochs and t.hparams["batch_size"] == spec.batch_size
        # The warm-up rounds are ranked by their predicted accuracy, tuned rounds by TPE.
        assert (t.predicted_accuracy is not None) == (t.round < config.search.hpo_start_round)
        assert (t.hparams["tpe_trial"] is not None) == (t.round >= config.search.hpo_start_round)
        assert t.weights_path == spec.weights_out
        epochs = read_jsonl(session.dir.trial(t.id) / "log.jsonl")
        assert [e["type"] for e in epochs] == ["epoch"] * spec.epochs + ["trial"]
        assert json.loads((session.dir.trial(t.id) / "graph.json").read_text())["layers"]
    # Every child after the first inherits from a trained parent, and records what the
    # Gaussian process predicted for it beside the parent's accuracy it was ranked against.
    assert trials[0].parent_id is None
    for t, spec in zip(trials[1:], trainer.specs[1:]):
        assert t.parent_id is not None
        assert spec.parent_weights == store.trial(t.parent_id).weights_path
        assert 0 < t.hparams["predicted_mean"] < 1.5 and t.hparams["predicted_std"] >= 0
        assert t.hparams["parent_accuracy"] == store.trial(t.parent_id).search_accuracy
    recorded = store.epochs(session.run_id)
    assert len(recorded) == sum(s.epochs for s in trainer.specs)
    assert {e.trial_id for e in recorded} == {t.id for t in trials}
    (rep,) = store.replicas(session.run_id)
    assert rep.status == TrialStatus.STOPPED and rep.reason == ""
    # The suggestion asked for a sixth round that never came is not left pending.
    told = [(t.state.name, t.value) for t in replica.hpo.study.trials]
    assert told == [("COMPLETE", trials[3].best_accuracy), ("COMPLETE", trials[4].best_accuracy),
                    ("FAIL", None)]
    store.close()


def test_a_baseline_search_keeps_its_lineage_without_weights_or_tpe(tmp_path):
    """The settings that measure the search: greedy choice of parent, children from fresh
    weights, no TPE (default batch, smallest kernel) in every round."""
    session = new_run(tmp_path, search='strategy = "greedy"\ninherit_weights = false\n'
                      'hpo = "none"\n')
    trainer = FakeTrainer()
    replica, store = make_replica(session, trainer)
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert len(trials) == 5 and all(t.status == TrialStatus.COMPLETED for t in trials)
    assert all(t.hparams["tpe_trial"] is None and t.hparams["batch_size"] == 64
               and t.hparams["kernel_size"] == 3 for t in trials)
    assert not replica.hpo.study.trials
    assert all(spec.parent_weights is None and spec.parent_graph is None
               for spec in trainer.specs)
    for i, t in enumerate(trials[1:], 1):
        # Greedy: each child's parent was the most accurate model trained when it was chosen:
        # while the trial before it trained (once anything is trained), or just after, for a
        # stand-in trainer done before the search thread read the history.
        best_known = {max(u.search_accuracy for u in trials[:k]) for k in {max(1, i - 1), i}}
        assert t.hparams["parent_accuracy"] in best_known
        assert t.hparams["parent_accuracy"] == store.trial(t.parent_id).search_accuracy
        assert t.hparams["predicted_mean"] is None
    store.close()


def test_the_papers_order_trains_each_tuned_architecture_twice(tmp_path):
    """hpo_order = "after_nas": from the fourth round each architecture is generated first
    (3x3 deepen blocks), trained at its parent's batch size, then again from the parent's
    weights at TPE's; the better training counts and its batch size goes to the children."""
    session = new_run(tmp_path, search='hpo_order = "after_nas"\n', max_rounds=6)
    trainer = FakeTrainer()
    trainer.batch_gain = 0.001
    replica, store = make_replica(session, trainer)
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.round for t in trials] == [0, 1, 2, 3, 4, 5]
    assert all(t.status == TrialStatus.COMPLETED and t.hparams["kernel_size"] == 3
               and t.hparams["tpe_trial"] is None for t in trials)
    assert len(trainer.specs) == 3 + 2 * 3
    by_id = {t.id: t for t in trials}
    epochs = store.epochs(session.run_id)
    for t in trials[3:]:
        first, second = t.extra["trainings"]
        # Trained first at the batch size its parent's better training had.
        parent = by_id[t.parent_id]
        assert first["batch_size"] == t.hparams["batch_size"] == \
            parent.extra.get("hpo_batch", parent.hparams["batch_size"])
        mine = sorted((e.epoch, e.batch_size) for e in epochs if e.trial_id == t.id)
        assert [n for n, _ in mine] == list(range(first["epochs"] + second["epochs"]))
        assert [b for _, b in mine] == [first["batch_size"]] * first["epochs"] + \
            [second["batch_size"]] * second["epochs"]
        better = second if second["best_accuracy"] > first["best_accuracy"] else first
        assert t.extra["hpo_batch"] == better["batch_size"]
        assert t.best_accuracy == max(first["best_accuracy"], second["best_accuracy"])
    seconds = [s for s in trainer.specs if s.first_epoch > 0]
    assert len(seconds) == 3 and all(s.save_above > 0 and s.parent_weights for s in seconds)
    # The study learnt from both trainings: the ones it suggested and the ones it was told of.
    states = [t.state.name for t in replica.hpo.study.trials]
    assert states.count("COMPLETE") == 6 and all(
        set(t.params) == {"batch_size"} for t in replica.hpo.study.trials)
    store.close()


def test_a_failure_that_repeats_ends_the_replica_with_the_fix(tmp_path):
    session = new_run(tmp_path, max_repeated_failures=2)
    replica, store = make_replica(session, FakeTrainer(fail="oom"))
    assert replica.run() == 1
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.FAILED] * 2
    (rep,) = store.replicas(session.run_id)
    assert rep.status == TrialStatus.FAILED
    assert "2 trials in a row failed" in rep.reason and "lower train.batch_size" in rep.reason
    store.close()


def test_the_deadline_stops_a_trial_that_keeps_its_epochs(tmp_path):
    session = new_run(tmp_path)
    now = [session.started_at]

    def pass_the_deadline(spec, epoch):
        if spec.round == 2 and epoch == 0:
            now[0] = session.deadline_at + 1

    trainer = FakeTrainer(on_epoch=pass_the_deadline, clock=lambda: now[0])
    replica, store = make_replica(session, trainer, clock=lambda: now[0])
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 2 + [TrialStatus.STOPPED]
    cut = trials[-1]
    assert cut.epochs_done == 1 and cut.best_accuracy is not None
    assert cut.finished_at == session.deadline_at + 1  # recorded by the replica's clock
    assert all(spec.finish_by == session.deadline_at for spec in trainer.specs)
    store.close()


def test_the_epoch_in_flight_at_the_deadline_finishes_inside_the_grace(tmp_path):
    """No epoch starts after the deadline, but the one in flight then finishes and is
    recorded if it ends inside the run's grace (a quarter of the duration by default)."""
    session = new_run(tmp_path)
    assert session.config.deadline_grace() == session.config.run.duration_s / 4
    now = [session.started_at]

    def cross_the_deadline(spec, epoch):
        if spec.round == 2 and epoch == 0:
            now[0] = session.deadline_at + session.config.deadline_grace() - 1

    trainer = FakeTrainer(during_epoch=cross_the_deadline, clock=lambda: now[0])
    replica, store = make_replica(session, trainer, clock=lambda: now[0])
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 2 + [TrialStatus.STOPPED]
    assert trials[-1].epochs_done == 1  # ended in the grace; the next one never started
    store.close()


def test_an_epoch_in_flight_past_the_grace_is_stopped(tmp_path):
    session = new_run(tmp_path, deadline_grace_s=30.0)
    now = [session.started_at]

    def overrun_the_grace(spec, epoch):
        if spec.round == 2 and epoch == 0:
            now[0] = session.deadline_at + 31

    trainer = FakeTrainer(during_epoch=overrun_the_grace, clock=lambda: now[0])
    replica, store = make_replica(session, trainer, clock=lambda: now[0])
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 2 + [TrialStatus.STOPPED]
    assert trials[-1].epochs_done == 0
    store.close()


def test_after_the_deadline_the_primary_waits_for_the_epochs_in_flight(tmp_path):
    """The session stays alive (its last_seen moves) while a replica works, and the wait
    ends when it stops, or once the grace and the stop's allowance are over."""
    from rich.console import Console

    session = new_run(tmp_path, deadline_grace_s=100.0, stop_grace_s=20.0)
    store = session.store = open_store(None, run_dir=session.dir.path)
    rep = store.register_replica(session.run_id, 0, session.segment, "node", 1, ["fake"],
                                 session.started_at)
    now = [session.deadline_at]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
        store.heartbeat(rep, now[0], 600.0)
        if len(slept) == 5:
            store.end_replica(rep, TrialStatus.STOPPED, now[0], "")

    steps.drain(session, Console(quiet=True), clock=lambda: now[0], sleep=sleep)
    assert len(slept) == 5 and now[0] == session.deadline_at + 5
    assert store.segments(session.run_id)[-1].last_seen == session.deadline_at + 5
    # A replica that never stops: the wait ends at the deadline + grace + stop allowance.
    other = store.register_replica(session.run_id, 1, session.segment, "node", 2, ["fake"],
                                   now[0])
    slept.clear()

    def sleep_beating(seconds):
        now[0] += seconds
        store.heartbeat(other, now[0], 600.0)

    steps.drain(session, Console(quiet=True), clock=lambda: now[0], sleep=sleep_beating)
    assert now[0] == session.deadline_at + 120
    store.close()


def test_a_candidate_ready_after_the_deadline_is_not_claimed(tmp_path):
    """A search that outlasts the session (a loaded host) ends the loop: no trial is claimed
    after the deadline, when the primary may already have counted the run's trials."""
    session = new_run(tmp_path)
    now = [session.started_at]
    replica, store = make_replica(session, FakeTrainer(), clock=lambda: now[0])
    search = replica._next_job

    def slow_search(round_index):
        job = search(round_index)
        if round_index == 1:
            now[0] = session.deadline_at + 1
        return job

    replica._next_job = slow_search
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.round for t in trials] == [0]
    assert all(t.created_at < session.deadline_at for t in trials)
    store.close()


def test_a_trainer_that_cannot_go_on_ends_the_replica_with_its_reason(tmp_path):
    session = new_run(tmp_path)
    trainer = FakeTrainer(lost_after=1)
    replica, store = make_replica(session, trainer)
    assert replica.run() == 1
    assert trainer.closed and len(trainer.specs) == 1
    (rep,) = store.replicas(session.run_id)
    assert rep.status == TrialStatus.FAILED
    assert rep.reason.startswith("the training processes failed to start 3 times in a row")
    # The trial it held when it gave up is failed with that reason, not left running.
    trials = store.trials(session.run_id)
    assert len(trials) == 2 and not any(t.status == TrialStatus.RUNNING for t in trials)
    last = max(trials, key=lambda t: t.id)
    assert last.status == TrialStatus.FAILED and last.reason == rep.reason
    store.close()


def past_its_deadline(session, then=lambda: None):
    """A replica of ``session`` whose clock passes the deadline in round 1's first epoch (and
    then calls ``then``), its node described; its store, trainer and clock (``now[0]``)."""
    now = [session.started_at]

    def pass_the_deadline(spec, epoch):
        if spec.round == 1 and epoch == 0:
            now[0] = session.deadline_at + 1
            then()

    trainer = FakeTrainer(on_epoch=pass_the_deadline, clock=lambda: now[0])
    replica, store = make_replica(session, trainer, clock=lambda: now[0])
    replica.node.probe = lambda started: {"devices": ["fake"], "ceiling_ops": 1e9}
    return replica, store, trainer, now


def test_the_ceiling_is_measured_again_once_the_runs_time_is_over(tmp_path):
    """Both ceilings recorded, the end's beside the start's, where the replica ran to its
    deadline; one whose rounds ended first measures nothing more (its seconds would be the
    run's)."""
    from automlperf.measure.result import latest_nodes

    session = new_run(tmp_path)
    asked = []
    replica, store, _, now = past_its_deadline(session)
    replica.node.measure_end = lambda: asked.append(now[0]) or {"ceiling_ops": 8e8, "ceiling": []}
    assert replica.run() == 0
    assert asked == [session.deadline_at + 1]
    node = latest_nodes(store.nodes(session.run_id))[0]
    assert node["ceiling_ops"] == 1e9 and node["ceiling_end_ops"] == 8e8
    store.close()
    (tmp_path / "early").mkdir()
    early = new_run(tmp_path / "early", max_rounds=1)
    replica, store = make_replica(early, FakeTrainer())
    replica.node.probe = lambda started: {"devices": ["fake"], "ceiling_ops": 1e9}
    replica.node.measure_end = lambda: asked.append("early") or {}
    assert replica.run() == 0 and asked == [session.deadline_at + 1]
    assert "ceiling_end_ops" not in latest_nodes(store.nodes(early.run_id))[0]
    store.close()


class EndSpy:
    """The end's measurement as the replica sees it (measure/ceiling.py EndMeasurement): what
    was asked of it, in order."""

    def __init__(self):
        self.asked, self.prepared = [], threading.Event()

    def prepare(self):
        self.asked.append("prepare")
        self.prepared.set()

    def __call__(self):
        self.asked.append("measure")
        return {"ceiling_ops": 8e8, "ceiling": []}

    def close(self):
        self.asked.append("close")


def test_the_ends_measurement_is_prepared_as_the_deadline_passes_and_closed_at_the_end(tmp_path):
    """Prepared once the clock passes the deadline, while the epoch in flight still trains,
    told to measure once the ranks have stopped, closed last; never prepared by a replica
    whose rounds end before its deadline."""
    session = new_run(tmp_path)
    end = EndSpy()

    def prepared():
        assert end.prepared.wait(60), "the end's measurement was not prepared"

    replica, store, _, _ = past_its_deadline(session, then=prepared)
    replica.node.measure_end = end
    assert replica.run() == 0
    assert end.asked == ["prepare", "measure", "close"]
    store.close()
    (tmp_path / "early").mkdir()
    early = new_run(tmp_path / "early", max_rounds=1)
    replica, store = make_replica(early, FakeTrainer())
    replica.node.probe = lambda started: {"devices": ["fake"], "ceiling_ops": 1e9}
    replica.node.measure_end = spy = EndSpy()
    assert replica.run() == 0 and spy.asked == ["close"]
    store.close()


@pytest.mark.parametrize("by_ranks, expected", [(True, ["measure", "close"]),
                                                  (False, ["close", "measure"])])
def test_a_measurement_by_the_ranks_is_made_before_they_stop(tmp_path, by_ranks, expected):
    """A CPU's end is measured by its rank (RankEnd's ``by_ranks``): asked while the trainer
    is still up, never after it closed; any other measurement once it has."""
    order = []
    replica, store, trainer, _ = past_its_deadline(new_run(tmp_path))
    trainer.close = lambda: order.append("close")

    class End:
        def __call__(self):
            order.append("measure")
            return {"ceiling_ops": 8e8, "ceiling": []}

    end = End()
    end.by_ranks = by_ranks
    replica.node.measure_end = end
    assert replica.run() == 0
    assert order == expected
    store.close()


class Flaky:
    """The replica's store, whose heartbeats fail ``failures`` times (any error: a bug in a
    client, a value the store refuses), then pass."""

    def __init__(self, store, failures):
        self.store, self.failures, self.beats = store, failures, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def heartbeat(self, replica_id, now, lease_s):
        self.beats += 1
        if self.beats <= self.failures:
            raise TypeError("cannot dump lists of mixed types")
        return self.store.heartbeat(replica_id, now, lease_s)


def test_the_heartbeat_thread_survives_any_failure_and_says_so_once(tmp_path, caplog):
    import logging
    import threading

    from door import wait_until

    session = new_run(tmp_path, heartbeat_s=0.01)
    replica, store = make_replica(session, FakeTrainer())
    rid = store.register_replica(session.run_id, 0, replica.segment.index, "n", 1, [], 1.0)
    flaky = replica.store = Flaky(store, failures=5)
    caplog.set_level(logging.WARNING, logger="automlperf")
    beat = threading.Thread(target=replica._heartbeat, args=(rid,), daemon=True)
    beat.start()
    try:
        wait_until(lambda: flaky.beats >= 8, what="beats past the failures")
    finally:
        replica.stop.set()
        beat.join(120)
    assert not beat.is_alive()
    lines = [r.getMessage() for r in caplog.records]
    assert sum(line.startswith("heartbeat failed (TypeError") for line in lines) == 1
    assert sum("heartbeats pass again after 5 failed" in line for line in lines) == 1
    store.close()


def test_a_cpus_end_is_measured_by_its_rank_or_else_in_a_process_of_its_own():
    """RankEnd asks the trainer's rank; where none is left to ask (the ranks killed past the
    grace), the fallback measures."""
    from automlperf.runner.noderecords import RankEnd

    class Ranks:
        def __init__(self, found):
            self.found = found

        def measure_again(self):
            return self.found

    fallback = []
    end = RankEnd(Ranks({"ceiling_ops": 2.0}), lambda: fallback.append(1) or {"ceiling_ops": 3.0})
    assert end.by_ranks and end() == {"ceiling_ops": 2.0} and fallback == []
    end = RankEnd(Ranks(None), lambda: fallback.append(1) or {"ceiling_ops": 3.0})
    assert end() == {"ceiling_ops": 3.0} and fallback == [1]
