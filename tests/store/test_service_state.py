"""What the store service keeps in memory of a run (store/service/state.py): a history read's
``also`` (the change numbers a reader asks for again) is looked up as a set, once per trial,
whatever its length: a list would cost every trial a pass over it, on the service's one event
loop, while no heartbeat is answered."""

from automlperf.store.base import ReplicaRecord
from automlperf.store.service.state import Loaded, RunState, Trial


class Counted(list):
    """A list that counts the lookups made in it."""

    lookups = 0

    def __contains__(self, item):
        type(self).lookups += 1
        return super().__contains__(item)


def run_state(trials=2_000, replicas=200):
    return RunState(1, Loaded(
        segments=[],
        replicas=[(ReplicaRecord(id=r, run_id=1, index=r, segment=0, host="n", pid=r,
                                 devices=[], started_at=1.0, last_heartbeat=1.0,
                                 status="running", reason=""), 60.0, r) for r in range(replicas)],
        trials=[Trial(id=t, replica_id=0, replica_index=0, graph_hash=f"h{t}", status="completed",
                      best_accuracy=0.5, predicted_accuracy=None, lease_until=None,
                      created_at=1.0, claimed=0, changed=t) for t in range(1, trials + 1)]))


def test_a_history_reads_also_is_looked_up_as_a_set():
    state = run_state()
    also = Counted([7, 99, 1500, 10**9] + [-1] * 5_000)
    found = state.changes(1_000, also)
    assert [c.changed for c in found] == [7, 99, *range(1_001, 2_001)]
    replicas = state.replica_changes(150, also)
    assert [n for n, _ in replicas] == [7, 99, *range(151, 200)]
    assert Counted.lookups == 0  # never a pass over the list per trial
