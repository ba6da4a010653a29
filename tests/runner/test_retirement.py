"""A replica that cannot train on its node retires itself; the run goes on with the others
and ends only when none is left. Judged on a real store, as the primary and the result do."""

from pathlib import Path

from automlperf.config import Config
from automlperf.measure.result import build_result
from automlperf.runner.session import failure, gave_up, retirement
from automlperf.store import TrialStatus, open_store

LOGS = Path("logs")


def session_with(tmp_path, n):
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}", create=True)
    run_id = store.create_run("r", {}, {"host": "h"}, 600.0, 1000.0)
    seg = store.start_segment(run_id, 1000.0, 1600.0)
    reps = [store.register_replica(run_id, i, seg, f"n{i + 1}", 40 + i, ["cpu"], 1000.0)
            for i in range(n)]
    return store, run_id, seg, reps


def test_one_replica_giving_up_retires_it_and_the_run_goes_on(tmp_path):
    store, run_id, seg, reps = session_with(tmp_path, 3)
    reason = "the dataset is not on this node (n3): /data/train not found"
    store.end_replica(reps[2], TrialStatus.FAILED, 1010.0, reason)
    assert failure(store, run_id, seg, [None, None, 1], LOGS, left=True) is None
    [rep] = gave_up(store, run_id, seg)
    assert retirement(rep) == f"replica 2 on n3 retired: {reason}"
    # The others finished their time: a completed run, with the retired replica named.
    for r in reps[:2]:
        store.end_replica(r, TrialStatus.STOPPED, 1600.0)
    assert failure(store, run_id, seg, [0, 0, 1], LOGS, left=False) is None
    result = build_result(store, run_id, Config.for_dataset("digits"), {})
    assert result["retired"] == [{"replica": 2, "host": "n3", "reason": reason}]
    assert result["failures"] == [] and "run_failed" not in {v["rule"] for v in result["violations"]}


def test_the_run_ends_when_every_replica_gave_up(tmp_path):
    store, run_id, seg, reps = session_with(tmp_path, 2)
    for r in reps:
        store.end_replica(r, TrialStatus.FAILED, 1010.0, "3 trials in a row failed with \"oom\"")
    assert failure(store, run_id, seg, [1, 1], LOGS, left=True) is None  # not while any is up
    why = failure(store, run_id, seg, [1, 1], LOGS, left=False)
    assert why == "replica 0 (n1): 3 trials in a row failed with \"oom\""
    result = build_result(store, run_id, Config.for_dataset("digits"), {})
    assert [f["replica"] for f in result["failures"]] == [0, 1] and result["retired"] == []
    assert not result["valid"] and "run_failed" in {v["rule"] for v in result["violations"]}


def test_replicas_that_exit_without_a_word_end_the_run_only_all_together(tmp_path):
    store, run_id, seg, _ = session_with(tmp_path, 2)
    assert failure(store, run_id, seg, [1, None], LOGS, left=True) is None
    assert "every replica exited with an error" in failure(store, run_id, seg, [1, 2], LOGS)


def test_a_replica_the_kernel_killed_for_memory_is_named_with_the_fix(tmp_path):
    """Under a job's memory limit the kernel can take a replica, not only a training process
    (an allocation in the moment a killed one is still returning its memory). The local
    launcher asks the kernel, and the run's one line says so with the advice for memory.
    Here a process of the launcher's runs out of a 64 MiB memory cgroup."""
    import subprocess
    import sys

    import pytest

    from automlperf.runner.launch import LocalLauncher
    from automlperf.train.oomkill import OomWatch
    from helpers import MemoryCgroup

    group, why = MemoryCgroup.make(64 << 20)
    if group is None:
        pytest.skip(why)
    try:
        proc = subprocess.Popen([sys.executable, "-c", "b = bytearray(b'x') * (1 << 30)"],
                                preexec_fn=group.enter, stderr=subprocess.DEVNULL)
        launcher = LocalLauncher(tmp_path, 1, None, simulated=True)
        launcher.procs.append(proc)
        launcher.watches.append(OomWatch.of(proc.pid))
        launcher.watches[0].arm()
        assert proc.wait(timeout=300) == -9
        [cause] = launcher.causes()
    finally:
        group.remove()
    assert cause is not None and "out-of-memory killer" in cause
    store, run_id, seg, _ = session_with(tmp_path, 1)
    line = failure(store, run_id, seg, [-9], LOGS, causes=[cause])
    assert line.startswith("every replica exited with an error before the deadline "
                           "(replica 0: -9, the kernel's out-of-memory killer ended it")
    assert "give each replica more memory" in line and "\n" not in line
    # Killed otherwise (by hand, by the batch system): the exit code alone, no advice.
    assert "memory" not in failure(store, run_id, seg, [-9], LOGS, causes=[None])
