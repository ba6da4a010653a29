"""The store service at work: protocol-faithful simulated replicas (bench/control_load.py)
against the real primary (`automlperf run --launcher external`, which starts the service)
and a real PostgreSQL server, counting what the replicas were told is stored against what
the store holds. Epochs last 4-8 s here, not a node's ~32 s, so that a minute holds trials
begun and ended; heartbeats, leases and samples are at a node's rates."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from automlperf.store import connections
from helpers import new_claim

BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_control
    finally:
        sys.path.remove(str(BENCH))
    return bench_control


def nothing_lost(found):
    assert found["errors"] == {}, found["errors"]
    assert found["registered"] == found["replicas"] == found["replica_rows"]
    assert found["lost"] == {"epochs": 0, "samples": 0, "claims": 0}, found
    assert found["duplicated"] == {"epochs": 0, "samples": 0, "claims": 0}, found
    assert found["expired_by_lease"] == 0 and found["charged_while_alive"] == 0, found
    assert found["epochs"] > 0 and found["trials"] > found["replicas"]


def test_two_hundred_replicas_lose_nothing_on_a_few_connections_through_kill_9_and_a_stop(
        tmp_path):
    """200 replicas for a minute and more, on the database connections of the service and the
    primary alone. Meanwhile the service is killed (kill -9), which the primary starts again,
    and then stopped (SIGSTOP) for 30 s, half a lease, after which it goes on where it was.
    Nothing acknowledged is lost, no live replica's trial is failed for the silence, and every
    replica goes on to the deadline. (One run for all three: each costs the suite a minute.)"""
    b = bench()
    faults = {"killed": None, "stopped": None, "pids": set()}

    def stored(url):
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT count(*) FROM amp_epochs")).scalar()
        finally:
            engine.dispose()

    def hook(run_dir, pid, url):
        if pid is None:
            return
        faults["pids"].add(pid)
        if faults["killed"] is None and stored(url) >= 200:
            os.kill(pid, signal.SIGKILL)
            faults["killed"] = stored(url)
        elif faults["killed"] is not None and faults["stopped"] is None and \
                len(faults["pids"]) > 1 and stored(url) >= faults["killed"] + 200:
            faults["stopped"] = pid
            os.kill(pid, signal.SIGSTOP)
            time.sleep(30)  # the fault: half the lease
            os.kill(pid, signal.SIGCONT)

    found = b.run(b.options(replicas=200, window=110, epoch_s=8, trial_epochs=3, processes=2,
                            work=tmp_path), hook)
    assert faults["killed"] and faults["stopped"], faults
    nothing_lost(found)
    assert found["segment_ended"]
    # The database sees the service's connections and the primary's, not the replicas'.
    assert found["connections_max"] <= connections.needed()
    assert found["latency_ms"]["heartbeat"]["n"] >= 200 * 10
    assert "the store service exited" in (tmp_path / "primary200.log").read_text()
    log = (Path(found["run_dir"]) / "logs" / "store-service.log").read_text()
    assert "stalled for" in log  # it noticed the stop, and held nobody's silence against them


def test_history_reads_through_the_service_hold_what_the_database_holds(served):
    """Each reader of the history ends with every trial as the database has it. A read just
    behind gets what changed (claims it saw come back without their hash); a read far behind
    (a first read, or a node's read a long trial later) may get the run's whole history as it
    stood up to ten seconds before, encoded once for many readers, and what changed since
    with its next read."""
    from automlperf.store.history import History

    remote, direct = served
    run_id = direct.create_run("r", {}, {}, 3600.0, 1.0)
    seg = direct.start_segment(run_id, 1.0, 3600.0)
    reps = [remote.register_replica(run_id, i, seg, f"n{i}", i, [], 1.0) for i in range(4)]
    early, late = History(run_id), History(run_id)

    def claim(k):
        return remote.claim_trial(new_claim(run_id=run_id, replica_id=reps[k % 4],
                                            replica_index=k % 4, graph_hash=f"h{k}", now=2.0,
                                            lease_s=600.0))

    def same(history):
        stored = {t.id: (t.graph_hash, t.status, t.search_accuracy if t.status == "completed"
                         else None) for t in direct.summaries(run_id)}
        held = {m.id: (m.content_hash, m.status, m.accuracy) for m in history.models()}
        assert held == stored

    trials = [claim(k) for k in range(300)]
    early.refresh(remote)
    same(early)
    for t in trials[:250]:
        remote.finish_trial(t, "completed", 3.0, best_accuracy=0.5)
    trials += [claim(k) for k in range(300, 310)]
    before = remote.bytes_in["changes"]
    assert early.refresh(remote) == 260  # 250 ends (without their hashes) and 10 claims
    same(early)
    late.refresh(remote)  # behind by everything: the whole history, as it stood
    late.refresh(remote)  # and since
    same(late)
    for t in trials[250:]:
        remote.finish_trial(t, "failed", 4.0)
    early.refresh(remote)
    late.refresh(remote)
    same(early)
    same(late)
    assert remote.bytes_in["changes"] > before
