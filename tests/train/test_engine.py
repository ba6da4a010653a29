"""The training engine under what real nodes do to it: uneven shards without join(),
failures that may poison device or collective state, SIGTERM to every process of a step,
a restart that fails, the dataset scanned once, and the cores a process really has."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from automlperf.graph import seeds
from automlperf.train.data import FileIndex
from automlperf.hardware import cgroup_cpu_quota
from automlperf.train.pool import DevicePool, PoolError, leaves_state_broken
from automlperf.train.pooltrainer import train_trial
from helpers import (WIDE, Recorder, data_section, measured_by_this_process,
                     pool_under_memory_limit, trial_spec)
from imagefolder import make_image_folder

spec = trial_spec


def test_which_failures_restart_the_pool():
    def failed(kind):
        return {"status": "failed", "extra": {"failure": kind}}

    # Ranks may have stopped at different collectives, or the device may be poisoned.
    assert leaves_state_broken(failed("oom"), "cpu", 2)
    assert leaves_state_broken(failed("error"), "cuda", 1)
    assert leaves_state_broken(failed("error"), "cpu", 2)
    # Seen alike by every rank, or found before any collective; or a CPU on its own.
    assert not leaves_state_broken(failed("nan"), "cuda", 8)
    assert not leaves_state_broken(failed("data"), "cuda", 8)
    assert not leaves_state_broken(failed("oom"), "cuda", 1)
    assert not leaves_state_broken(failed("error"), "cpu", 1)
    assert not leaves_state_broken({"status": "completed", "extra": {}}, "cuda", 8)


@pytest.mark.slow
def test_rank_zero_measures_the_node_again_between_trials_until_it_is_killed():
    """The rank that measured the node as the pool started measures it again when asked (a
    CPU's ceiling at the run's end: no process of its own), and trains on after; once the
    ranks are killed nobody is left to ask."""
    with DevicePool(["cpu"], data_section("digits"), first_start=measured_by_this_process) as pool:
        rank = pool._ranks[0].process.pid
        assert pool.description["node"]["pid"] == rank
        assert pool.measure_again()["pid"] == rank
        assert train_trial(pool, spec("after")).status == "completed"
        assert pool.measure_again()["pid"] == rank
        pool._restart(kill_only=True)
        assert pool.measure_again() is None
    with DevicePool(["cpu"], data_section("digits")) as pool:
        assert pool.measure_again() is None  # never given a measurement


def rendezvous_files(pool):
    return [f for f in os.listdir(pool._scratch) if f.startswith("rendezvous")]


@pytest.mark.slow
def test_uneven_shards_train_on_two_gloo_ranks_without_join(tmp_path):
    # 1437 images, 359 per rank: the shards (719 and 718 images) would take 3 and 2 steps.
    rec = Recorder()
    with DevicePool(["cpu"] * 2, data_section("digits")) as pool:
        # The ranks train with their rendezvous file gone (removed once they have joined).
        assert rendezvous_files(pool) == []
        out = train_trial(pool, spec("uneven", epochs=2, batch_size=718, lr_per_256=0.1,
                                   weights_out=str(tmp_path / "w.safetensors")), rec)
    assert out.status == "completed", out.reason
    assert [(e["train_images"], e["steps"]) for e in rec.epochs] == [(1437, 2)] * 2
    from safetensors.torch import load_file

    weights = load_file(out.weights)
    assert any(k.endswith("running_mean") for k in weights)


@pytest.mark.slow
def test_an_out_of_memory_failure_on_several_ranks_restarts_the_pool():
    pool = pool_under_memory_limit(["cpu"] * 2)
    with pool:
        before = [r.process.pid for r in pool._ranks]
        out = pool.run(spec("oom", graph=WIDE, batch_size=2048))
        assert out.status == "failed" and out.extra["failure"] == "oom"
        assert pool.restarts == 1 and not set(before) & {r.process.pid for r in pool._ranks}
        # The new ranks met through a fresh rendezvous file (a FileStore file cannot be
        # reused), with no port chosen here for rank 0 to bind later.
        assert pool._starts == 2 and rendezvous_files(pool) == []
        small = seeds.resnet_small(10, 16, 3)
        assert pool.run(spec("fits", graph=small, batch_size=256)).status == "completed"


def tree(pool):
    """Every process of the pool below this one: ranks and their data-loading workers."""
    procs = []
    for rank in pool._ranks:
        p = psutil.Process(rank.process.pid)
        procs += [p, *p.children(recursive=True)]
    return procs


@pytest.fixture
def folder_pool(tmp_path):
    make_image_folder(tmp_path / "data", classes=4, train_per_class=8, val_per_class=2, corrupt=0)
    data = data_section("imagenet", data_dir=tmp_path / "data", image_size=16, workers=1)
    with DevicePool(["cpu"], data, restart_backoff_s=0) as pool:
        yield pool, tmp_path / "data"


SMALL16 = seeds.resnet_small(num_classes=4, image_size=16, in_channels=3)


@pytest.mark.slow
def test_sigterm_to_every_process_of_a_step_is_a_stop_not_a_crash(folder_pool):
    pool, _ = folder_pool
    signalled = []

    def terminate_all(kind, msg):
        if kind == "progress" and not signalled:
            procs = tree(pool)
            assert len(procs) >= 2  # a rank and its decoding worker
            for p in procs:
                p.send_signal(signal.SIGTERM)
            signalled.extend(p.pid for p in procs)

    # What a batch system does at a time limit: SIGTERM to every process of the step. The
    # ranks and workers carry on; the replica decides.
    out = train_trial(pool, spec("term", graph=SMALL16, epochs=2, batch_size=8), terminate_all)
    assert out.status == "completed", out.reason
    assert pool.restarts == 0 and all(psutil.pid_exists(p) for p in signalled[:1])
    # The trial's loader went with the trial: no decoding workers wait in the rank.
    assert all(not psutil.Process(r.process.pid).children() for r in pool._ranks)
    # With the replica's stop flag set by the same signal: stopped, nothing restarted.
    stop = []

    def terminate_and_stop(kind, msg):
        if kind == "progress" and not stop:
            for p in tree(pool):
                p.send_signal(signal.SIGTERM)
            stop.append(True)

    out = train_trial(pool, spec("stop", graph=SMALL16, epochs=3, batch_size=8), terminate_and_stop,
                    should_stop=lambda: bool(stop))
    assert out.status == "stopped" and pool.restarts == 0 and not pool._ranks


@pytest.mark.slow
def test_the_folder_is_scanned_once_and_a_failed_restart_does_not_end_the_pool(folder_pool):
    pool, data_dir = folder_pool
    train_images = pool.description["dataset"]["train_images"]
    index_dir = pool.index_dir
    # Files added after the start are not picked up by a restart: nothing rescans.
    extra = data_dir / "train" / "n00000000" / "late.JPEG"
    extra.write_bytes(next((data_dir / "train" / "n00000000").glob("*.JPEG")).read_bytes())

    def kill_rank(kind, msg):
        if kind == "progress" and pool._ranks:
            os.kill(pool._ranks[0].process.pid, signal.SIGKILL)

    out = train_trial(pool, spec("crash", graph=SMALL16, epochs=2, batch_size=8), kill_rank)
    assert out.reason.startswith("crash:") and pool.restarts == 1
    assert pool.description["dataset"]["train_images"] == train_images
    # A restart that fails (its index gone) leaves the pool down, not the caller dead ...
    saved = FileIndex.load(index_dir)
    saved = FileIndex(saved.root, saved.classes, saved.blob.copy(), saved.offsets.copy(),
                      saved.labels.copy(), saved.train_size)
    for name in os.listdir(index_dir):
        os.remove(os.path.join(index_dir, name))
    out = train_trial(pool, spec("crash-again", graph=SMALL16, epochs=2, batch_size=8), kill_rank)
    assert out.reason.startswith("crash:") and not pool._ranks
    assert "image index cannot be read" in pool.start_error
    # ... and the next trial starts it again.
    saved.save(index_dir)
    assert train_trial(pool, spec("after", graph=SMALL16, batch_size=8)).status == "completed"
    # Starts that keep failing are an error the replica reports.
    for name in os.listdir(index_dir):
        os.remove(os.path.join(index_dir, name))
    pool.kill()
    pool._scratch = os.path.dirname(index_dir)  # kill() removed it; keep starting from there
    os.makedirs(index_dir, exist_ok=True)
    with pytest.raises(PoolError, match="failed to start 3 times in a row"):
        train_trial(pool, spec("never", graph=SMALL16, batch_size=8))


CORES = """
import os, sys
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
from automlperf.hardware import cores_available
print(cores_available())
"""


@pytest.mark.parametrize("env,cpus,expected", [
    ({"SLURM_CPUS_PER_TASK": "64"}, "0", 1),        # the job's figure, not this step's
    ({"SLURM_CPUS_ON_NODE": "1"}, "0,1", 2),        # the step sees both cores
])
def test_cores_come_from_the_real_affinity_not_slurm_variables(env, cpus, expected):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    done = subprocess.run([sys.executable, "-c", CORES, cpus], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == expected


def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path):
    (tmp_path / "proc").write_text("0::/job_1/step_0\n")
    step = tmp_path / "cg" / "job_1" / "step_0"
    step.mkdir(parents=True)
    (step / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 1.5
    (step / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "absent") is None


def test_default_batch_and_learning_rate_stay_where_training_is_stable():
    import torch

    from automlperf.config import Config
    from automlperf.train.data import SyntheticDataset
    from automlperf.train.trainer import MAX_LR, RankContext, _Run

    train = Config.for_dataset("imagenet").train
    assert train.per_device_batch(80.0) == 256 and train.per_device_batch(16.0) == 224
    assert train.per_device_batch(None) == 64
    # 8 GPUs at TPE's top (512 each): linear scaling would give a learning rate of 1.6 x 4.
    graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
    data = SyntheticDataset(image_size=8, num_classes=10, train_images=64)
    run = _Run(spec("lr", graph=graph, batch_size=16384, lr_per_256=0.4),
               RankContext(0, 1, torch.device("cpu"), data), graph)
    assert run.lr == MAX_LR and run.optimizer.param_groups[0]["initial_lr"] == MAX_LR


# One of two Gloo ranks (argv: rank, rendezvous), each with the same small seed model's
# training run on synthetic 8x8 images; the scripts below continue from here.
RANK_RUN = """
import sys, torch, torch.distributed as dist
from automlperf.graph import seeds
from automlperf.train.data import SyntheticDataset
from automlperf.train.trainer import RankContext, TrialSpec, _Run

rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
spec = TrialSpec("two-ranks", graph.to_dict(), epochs=1, batch_size=16, patience=1)
data = SyntheticDataset(image_size=8, num_classes=10, train_images=32)
run = _Run(spec, RankContext(rank, 2, torch.device("cpu"), data, distributed=True), graph)
"""


def run_two_ranks(script, tmp_path):
    """Run ``script`` (a RANK_RUN continuation) as ranks 0 and 1; their standard outputs."""
    init = f"file://{tmp_path}/rendezvous"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), init], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    return [o[0] for o in outs]

BN_RANK = RANK_RUN + """
bn = next(m for m in run.module.modules() if isinstance(m, torch.nn.BatchNorm2d))
bn.running_mean.fill_(float(rank))   # each rank's own statistics differ
bn.running_var.fill_(1.0 + 2 * rank)
run.validate()
print(float(bn.running_mean[0]), float(bn.running_var[0]))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_validation_uses_batchnorm_statistics_averaged_over_ranks(tmp_path):
    outs = run_two_ranks(BN_RANK, tmp_path)
    assert [o.split() for o in outs] == [["0.5", "2.0"]] * 2


def _state(run):
    """Everything a step may change on a rank: parameters, buffers, optimiser state and the
    schedule's position, as bytes (the same in PLACEHOLDER_RANK)."""
    import torch

    tensors = [*run.module.parameters(), *run.module.buffers()]
    for state in run.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return [t.detach().cpu().numpy().tobytes() for t in tensors] + [run.schedule.last_epoch]


PLACEHOLDER_RANK = RANK_RUN + """
import hashlib, json

def _state(run):
    tensors = [*run.module.parameters(), *run.module.buffers()]
    for state in run.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return [t.detach().cpu().numpy().tobytes() for t in tensors] + [run.schedule.last_epoch]

torch.manual_seed(rank)
def real_step():
    run._step(torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,)))
real_step()  # momentum buffers exist from here on
before = _state(run)
run._placeholder_step()  # every rank's share of this step is empty
all_empty_kept = _state(run) == before
buffers = [b.clone() for b in run.module.buffers()]
if rank == 0:
    real_step()
else:
    run._placeholder_step()
buffers_kept = all(torch.equal(a, b) for a, b in zip(buffers, run.module.buffers()))
shared = _state(run)[:len(list(run.module.parameters()))] + _state(run)[-1:]
opt = [v.numpy().tobytes() for s in run.optimizer.state.values() for v in s.values()
       if isinstance(v, torch.Tensor)]
digest = hashlib.sha256(b"".join(x if isinstance(x, bytes) else str(x).encode()
                                 for x in shared + opt)).hexdigest()
print(json.dumps({"all_empty_kept": all_empty_kept, "buffers_kept": buffers_kept,
                  "digest": digest}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_placeholder_step_changes_nothing_but_what_every_rank_shares(tmp_path):
    """2 Gloo ranks. When every rank's share of a step is empty, no rank changes anything.
    When only rank 1's is, it joins rank 0's all-reduce, keeps its own BatchNorm statistics,
    and applies the averaged gradient as rank 0 does: both end with the same parameters and
    optimiser state."""
    import json

    outs = run_two_ranks(PLACEHOLDER_RANK, tmp_path)
    got = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert all(g["all_empty_kept"] for g in got)
    assert got[1]["buffers_kept"] and not got[0]["buffers_kept"]
    assert got[0]["digest"] == got[1]["digest"]


# Dynamo's graphs through its eager backend: what is counted is the graphs Dynamo
# captures, which Inductor would only make slower to build (the trainer's own compiled
# trials: tests/train/test_compiling.py).
COMPILED_RANK = RANK_RUN.replace("patience=1)", "patience=1, compile=True)").replace(
    "run = _Run(", """import functools
from automlperf.train import compiling, trainer
trainer.compile_module = functools.partial(compiling.compile_module, backend="eager")
run = _Run(""") + """
import hashlib, json
from automlperf.train.compiling import compiled_graphs

torch.manual_seed(rank)
def step(n):
    run._step(torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,)))
step(8)  # the full batch: compiled
if rank == 0:
    step(8)
else:
    run._placeholder_step()  # its share of this step was unreadable
step(5)  # an epoch's short last batch
params = b"".join(p.detach().numpy().tobytes() for p in run.module.parameters())
print(json.dumps({"graphs": compiled_graphs() - run.graphs_before,
                  "digest": hashlib.sha256(params).hexdigest()}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_compiled_ranks_run_placeholder_steps_and_short_batches_eagerly(tmp_path):
    """2 Gloo ranks, compiled under DistributedDataParallel: a placeholder step and a short
    batch run the module eagerly (no second graph), and the ranks stay alike."""
    import json

    import torch

    outs = run_two_ranks(COMPILED_RANK, tmp_path)
    got = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    # Torch before 2.6 has no stances: a graph for each batch size a rank met.
    assert [g["graphs"] for g in got] == ([1, 1] if hasattr(torch.compiler, "set_stance")
                                          else [2, 3])
    assert got[0]["digest"] == got[1]["digest"]


def test_a_placeholder_step_on_a_lone_rank_changes_nothing():
    import torch

    from automlperf.train.data import SyntheticDataset
    from automlperf.train.trainer import RankContext, _Run

    graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
    data = SyntheticDataset(image_size=8, num_classes=10, train_images=32)
    run = _Run(spec("ph", graph=graph, batch_size=8, weight_decay=5e-4),
               RankContext(0, 1, torch.device("cpu"), data), graph)
    run._step(torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,)))
    before = _state(run)
    assert any(run.optimizer.state.values())  # momentum that a step would apply again
    run._placeholder_step()
    assert _state(run) == before


@pytest.mark.slow
def test_close_waits_for_all_ranks_together_and_leaves_nothing():
    """Two ranks that cannot answer (stopped): close() gives them stop_wait_s together,
    then kills them; one by one it would have waited twice as long."""
    import time

    pool = DevicePool(["cpu"] * 2, data_section("digits"), stop_wait_s=10)
    scratch, ranks = pool._scratch, [r.process for r in pool._ranks]
    for proc in ranks:
        os.kill(proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    pool.close()
    # Waiting for each in turn could not take less than 2 x 10 s.
    assert time.monotonic() - started < 20
    assert not any(p.is_alive() for p in ranks) and not os.path.exists(scratch)


KILLED_POOL = """
import sys, time
from automlperf.config import Config
from automlperf.train.pool import DevicePool

pool = DevicePool(["cpu"], Config.for_dataset("digits").data)
print(pool._scratch, flush=True)
time.sleep(3600)
"""


@pytest.mark.slow
def test_the_folder_of_a_killed_pool_is_removed_by_the_next(tmp_path, monkeypatch):
    import tempfile

    from automlperf.train.pool import new_scratch, remove_stale_scratch

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_POOL], text=True,
                            stdout=subprocess.PIPE, env=dict(os.environ, TMPDIR=str(tmp)))
    killed = proc.stdout.readline().strip()
    assert killed.startswith(str(tmp)) and os.path.isdir(killed)
    proc.kill()  # SIGKILL: no atexit, no close()
    proc.wait(timeout=60)
    assert os.path.isdir(killed)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    live, fd = new_scratch()  # a pool still running
    unlocked = tmp / "automlperf-pool-earlier"  # no lock file: not known to be stale
    unlocked.mkdir()
    try:
        assert not os.path.exists(killed)  # the new pool's start removed it
        assert remove_stale_scratch() == [] and os.path.isdir(live) and unlocked.is_dir()
    finally:
        os.close(fd)
    assert remove_stale_scratch() == [live]
