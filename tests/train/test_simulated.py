"""The simulated accelerator: its timing model (the real operation counter, the modelled
rate), its seeded learning curves, its stop, and a replica that runs on it without torch;
the labels that keep a simulated result from passing for a measured one."""

import json
import random
import subprocess
import sys
import threading
import time

import pytest
from helpers import SMALL8, trial_spec
from helpers import sim_config as sim_run_config
from helpers import make_replica

from automlperf.config import Config, ConfigError
from automlperf.events import TrialStatus
from automlperf.graph import seeds
from automlperf.submission.check import check_run, official_refusal
from automlperf.measure.result import build_result, write_result
from automlperf.measure.system import describe
from automlperf.ops import count, epoch_ops
from automlperf.report.html import write_report
from automlperf.runner import session as steps
from automlperf.runner.primary import simulated_system
from automlperf.search import morph
from automlperf.train.simulated import CurveModel, SimulatedTrainer, dataset_shape, simulated_devices
from automlperf.train.spec import plan_steps


class FakeTime:
    """A clock that moves only when slept on: the timing model without the waiting."""

    def __init__(self):
        self.now = 1_000.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


class Sink:
    def __init__(self):
        self.events = []

    def epoch(self, event):
        self.events.append(event)

    def trial(self, outcome):
        pass


def sim_config(dataset="digits", **simulation):
    settings = {"sustained_ops": 1e9, **simulation}
    return Config.for_dataset(dataset, {"run": {"accelerator": "simulated"},
                                        "simulation": settings})


def trainer(config, devices=1, clock=None):
    clock = clock or FakeTime()
    t = SimulatedTrainer(simulated_devices(devices), config, clock=clock.clock, sleep=clock.sleep)
    t.start()
    return t, clock


def test_an_epoch_lasts_the_counted_operations_at_the_sustained_rate():
    config = sim_config(sustained_ops=2e9, time_compression=4.0)
    for devices in (1, 2):
        sim, clock = trainer(config, devices)
        sink = Sink()
        outcome = sim.train(trial_spec(epochs=3, batch_size=64, patience=10), sink)
        assert outcome.status == TrialStatus.COMPLETED and outcome.epochs == 3
        per_rank = 64 // devices
        steps = plan_steps(1437, devices, per_rank)
        ops = epoch_ops(count(SMALL8, batch_size=64), 1437, steps, 360)
        for e in sink.events:
            assert (e.train_images, e.val_images, e.steps, e.ops) == (1437, 360, steps, ops)
            assert (e.batch_size, e.world_size, e.precision) == (64, devices, "bf16")
            # Counted operations / (rate x devices) / compression, by the clock it waits on.
            assert e.ended_at - e.started_at == pytest.approx(ops / (2e9 * devices * 4.0))
        assert max(clock.slept) <= config.simulation.poll_s + 1e-12
        assert outcome.best_accuracy == max(e.val_accuracy for e in sink.events)


def test_recording_an_epoch_does_not_stall_the_simulated_device():
    """Epoch ends are kept from the trial's start: the time the host spends recording an
    epoch overlaps the next one, as it does beside a real device."""
    config = sim_config()
    sim, clock = trainer(config)
    length = sim.plan(trial_spec(), SMALL8).seconds

    class SlowSink(Sink):
        def epoch(self, event):
            super().epoch(event)
            clock.now += 0.4 * length  # the store takes its time

    sink = SlowSink()
    began = clock.now
    outcome = sim.train(trial_spec(epochs=5, patience=10), sink)
    assert outcome.status == TrialStatus.COMPLETED and outcome.epochs == 5
    ends = [e.ended_at for e in sink.events]
    assert ends == pytest.approx([began + (k + 1) * length for k in range(5)])
    assert [e.started_at for e in sink.events] == pytest.approx([began] + ends[:-1])
    # Five epochs of device time and the last record: nothing of the other four records.
    assert clock.now == pytest.approx(began + 5 * length + 0.4 * length)


def test_the_simulated_device_keeps_the_deadline_and_a_second_trainings_numbers():
    """No simulated epoch starts at or after the spec's finish_by, and a second training of
    a trial (the paper's HPO order) numbers its epochs on from the first's; the modelled
    loss is recorded as the validation loss early stopping may watch."""
    config = sim_config()
    sim, clock = trainer(config)
    length = sim.plan(trial_spec(), SMALL8).seconds
    sink = Sink()
    outcome = sim.train(trial_spec(epochs=5, patience=10, first_epoch=4,
                                   finish_by=clock.now + 2.5 * length), sink)
    assert outcome.status == TrialStatus.STOPPED and outcome.reason == "deadline reached"
    assert [e.epoch for e in sink.events] == [4, 5, 6]  # the third started before finish_by
    assert all(e.val_loss == pytest.approx(e.train_loss) and e.val_loss > 0 for e in sink.events)


def test_the_simulated_datasets_have_the_real_counts():
    from automlperf.train import data

    for name in ("digits", "builtin"):
        config = Config.for_dataset(name)
        real = data.load(config.data).describe()
        shape = dataset_shape(config.data)
        assert {k: shape[k] for k in real if k != "official"} == \
            {k: real[k] for k in real if k != "official"}
    imagenet = dataset_shape(Config().data)
    assert (imagenet["classes"], imagenet["train_images"], imagenet["val_images"]) == \
        (1000, 1_281_167, 50_000)


def run_curve(config, spec):
    sim, _ = trainer(config)
    sink = Sink()
    sim.train(spec, sink)
    return [e.val_accuracy for e in sink.events]


def test_accuracy_is_seeded_by_trial_and_epoch_and_rises_as_training_goes_on():
    config = sim_config()
    spec = trial_spec(epochs=8, patience=20, seed=17)
    first = run_curve(config, spec)
    assert first == run_curve(config, spec)  # the same seed, trial and epochs: the same curve
    assert first != run_curve(config, trial_spec(epochs=8, patience=20, seed=18))
    assert all(0 < a <= 1 for a in first)
    assert first[-1] > first[0] + 0.3  # it learns: from near chance towards its plateau
    # A validation is a count of correct images out of the validation set.
    assert all(abs(a * 360 - round(a * 360)) < 1e-9 for a in first)


def test_grown_networks_and_good_batches_reach_higher_accuracy():
    config = sim_config("imagenet", sustained_ops=2e14)
    model = CurveModel.for_config(config)
    seed = seeds.resnet50()
    rng = random.Random(3)
    grown = seed
    for _ in range(4):
        grown = morph(grown, "deepen", rng).graph
    seed_acc = [model.final_accuracy(seed, 192, s) for s in range(20)]
    grown_acc = [model.final_accuracy(grown, 192, s) for s in range(20)]
    assert 0.70 < sum(seed_acc) / 20 < 0.82  # near ResNet-50's top-1 at the full budget
    assert sum(grown_acc) / 20 > sum(seed_acc) / 20 + 0.005
    far = [model.final_accuracy(seed, 48, s) for s in range(20)]
    assert sum(far) / 20 < sum(seed_acc) / 20 - 0.01  # TPE has a batch size to find
    # A warm-up round that stops at a quarter of the learning-rate horizon ends lower.
    assert model.mean_accuracy(0.76, 14, 60) < model.mean_accuracy(0.76, 59, 60) == \
        pytest.approx(0.76)


def test_a_stop_ends_an_epoch_within_one_poll_and_keeps_the_epochs_done():
    config = sim_config(poll_s=0.25)
    sim, clock = trainer(config)
    length = sim.plan(trial_spec(), SMALL8).seconds
    stop_at = clock.now + 2.5 * length  # in the middle of the third epoch
    sink = Sink()
    outcome = sim.train(trial_spec(epochs=5, patience=10), sink,
                        should_stop=lambda: clock.now >= stop_at)
    assert outcome.status == TrialStatus.STOPPED and outcome.reason == "deadline reached"
    assert outcome.epochs == 2 and len(sink.events) == 2
    assert stop_at <= clock.now <= stop_at + 0.25 + 1e-9


def test_a_stop_interrupts_a_long_wait_on_the_real_clock():
    """An epoch an H100-class device would take hours for ends as soon as it is told to."""
    config = sim_config("imagenet", sustained_ops=2e14, poll_s=0.05)
    sim = SimulatedTrainer(simulated_devices(1), config)
    sim.start()
    spec = trial_spec(graph=seeds.resnet50(), batch_size=256, epochs=2)
    assert sim.plan(spec, seeds.resnet50()).seconds > 60
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    outcome = sim.train(spec, Sink(), should_stop=stop.is_set)
    assert outcome.status == TrialStatus.STOPPED and outcome.epochs == 0
    assert time.monotonic() - started < 60  # a guard: it returns one poll after the stop


def test_a_trial_the_real_trainer_would_refuse_fails_alike():
    sim, _ = trainer(sim_config(), devices=2)
    outcome = sim.train(trial_spec(batch_size=1), Sink())
    assert outcome.status == TrialStatus.FAILED and outcome.extra["failure"] == "data"
    assert "smaller than the 2 ranks" in outcome.reason
    wrong = seeds.resnet_small(num_classes=10, image_size=12, in_channels=1)
    outcome = sim.train(trial_spec(graph=wrong), Sink())
    assert outcome.status == TrialStatus.FAILED and "does not match" in outcome.reason


def test_an_official_simulated_run_is_refused_and_the_setting_is_checked():
    with pytest.raises(ConfigError, match="official run refused: run.accelerator is "
                                          "\"simulated\""):
        Config.for_dataset("imagenet", {"run": {"accelerator": "simulated",
                                                "official": True}}).check_official()
    with pytest.raises(ConfigError, match="run.accelerator"):
        Config.parse({"run": {"accelerator": "fake"}})


def simulated_run(tmp_path, rounds=4, sustained_ops=1e13):
    """A run directory prepared as `automlperf run` prepares it, for a replica in-process."""
    (tmp_path / "config.toml").write_text(sim_run_config(sustained_ops, lease_timeout_s=600,
                                                      max_rounds=rounds))
    config = Config.load(tmp_path / "config.toml")
    system = describe(simulated=simulated_system(config))  # as `automlperf run` describes it
    return steps.prepare(config, tmp_path / "run", None, False, system)


def test_a_simulated_result_is_labelled_verified_and_never_official(tmp_path):
    session = simulated_run(tmp_path)
    sim = SimulatedTrainer(simulated_devices(1), session.config)
    replica, store = make_replica(session, sim)
    assert replica.run() == 0
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 4
    assert all(t.weights_path is None for t in trials)  # nothing to inherit, nothing written
    store.end_segment(session.run_id, session.segment, time.time())
    system = json.loads(session.dir.system.read_text())
    assert system["simulated"] and "torch" not in system["software"]
    result = build_result(store, session.run_id, session.config, system)
    write_result(session.dir.result, result)
    store.close()
    assert result["simulated"] is True and result["valid"] is False and not result["official"]
    assert result["simulation"] == {"sustained_ops_per_device": 1e13, "time_compression": 1.0,
                                    "device_memory_gib": 80.0}
    assert result["violations"][0]["rule"] == "simulated"
    report = check_run(session.dir.path)
    assert report.ok, report.mismatches  # every epoch's operations recounted from its graph
    assert report.checked["logged_epochs"] == report.checked["epochs"] > 0
    assert official_refusal(report.result).startswith("refused: a simulated run is never an "
                                                      "official result")
    # A result edited to pass for a measured one is caught.
    edited = dict(result, simulated=False, simulation=None)
    write_result(session.dir.result, edited)
    assert any("simulated is False" in m for m in check_run(session.dir.path).mismatches)
    # The report still says what the run was: its configuration is the run's own.
    html = write_report(session.dir.path).read_text()
    assert 'id="simulated" role="alert">SIMULATED RUN: these figures are not measurements.' in html
    write_result(session.dir.result, result)
    html = write_report(session.dir.path).read_text()
    assert "<title>automlperf report (SIMULATED, not a measurement)" in html
    assert 'id="simulated" role="alert">SIMULATED RUN: these figures are not measurements.' in html
    # The machine's watts are not the modelled devices'.
    assert result["energy_j"] is None and result["ops_per_watt"] is None


@pytest.mark.slow
def test_a_simulated_worker_never_loads_torch(tmp_path):
    """The worker's whole path (run_worker -> open_replica -> the loop), in a fresh
    interpreter: no module of torch is loaded, and the replica trains its rounds."""
    session = simulated_run(tmp_path, rounds=2)
    session.store.close()
    code = ("import sys\nfrom automlperf.runner.worker import run_worker\n"
            f"code = run_worker({str(session.dir.path)!r}, None, 0, None, None, sample=False)\n"
            "print(code, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout[-2000:]
    from automlperf.store import open_store

    store = open_store(None, run_dir=session.dir.path)
    trials = store.trials(session.run_id)
    assert [t.status for t in trials] == [TrialStatus.COMPLETED] * 2
    (node,) = store.nodes(session.run_id)
    assert node["simulated"] and node["system"]["accelerators"][0]["simulated"]
    assert "torch" not in node["system"]["software"]
    store.close()


@pytest.mark.slow
def test_sigterm_stops_a_simulated_worker_in_the_middle_of_an_epoch(tmp_path):
    """An epoch that would last for days on the modelled device: SIGTERM ends it (the wait
    looks for a stop every poll), the trial is recorded as stopped and the worker exits 0."""
    import signal

    from helpers import cli_args, wait_for

    from automlperf.store import open_store

    session = simulated_run(tmp_path, rounds=2, sustained_ops=1e3)
    session.store.close()
    store = open_store(None, run_dir=session.dir.path)
    worker = subprocess.Popen(cli_args("worker", "--run-dir", session.dir.path,
                                       "--replica-index", 0, "--wait", 0, "--no-monitor"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(t.status == TrialStatus.RUNNING for t in store.trials(session.run_id)),
                 300, "a simulated trial to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=120) == 0, worker.stderr.read()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    (trial,) = store.trials(session.run_id)
    assert trial.status == TrialStatus.STOPPED and trial.epochs_done == 0
    (rep,) = store.replicas(session.run_id)
    assert rep.status == TrialStatus.STOPPED
    store.close()
