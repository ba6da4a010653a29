"""The store service's calls (store/service/calls.py), read off Store's signatures: every call
has one, what the run's own client sends conforms, what another version (or a broken client)
could send does not: types, and the bounds of store/limits.py written on Store's hints (finite
times, accuracies from 0 to 1, bounded lists and strings, known statuses), each refused in one
line naming the call."""

import dataclasses
import math
from typing import Annotated

import pytest

from automlperf.store.base import Changes, ReplicaRecord, SegmentRecord, Store, TrialChange
from automlperf.store.hints import Rule, conforms, named
from automlperf.store.service import server, wire
from automlperf.store import limits
from automlperf.store.service.calls import CALLS, LOCAL, PRIMARY_ONLY, CallError
from helpers import epoch_of, new_claim


def test_every_call_of_the_store_is_a_call_of_the_service_and_the_service_has_no_other():
    assert set(CALLS) == (Store.__abstractmethods__ - LOCAL) | {"open"}
    handlers = {name[3:] for name in dir(server.Service) if name.startswith("op_")}
    assert handlers <= set(CALLS), handlers - set(CALLS)
    assert PRIMARY_ONLY < set(CALLS)


def sent(name, *args, **kwargs):
    """What the run's client sends for ``store.<name>(*args, **kwargs)``, through JSON."""
    return wire.decode(0, wire.encode(CALLS[name].sent(*args, **kwargs))[wire.HEADER.size:])


def test_what_the_client_sends_travels_by_name_and_conforms():
    beat = sent("heartbeat", 3, 1.5, lease_s=60)
    assert beat == {"replica_id": 3, "now": 1.5, "lease_s": 60}
    assert CALLS["heartbeat"].arguments(beat) == beat
    assert CALLS["expire_leases"].arguments(sent("expire_leases", 1, math.inf))["now"] == math.inf
    finish = sent("finish_trial", 4, "completed", 3.0, best_accuracy=0.5, extra={"k": 1})
    assert finish["reason"] == "" and finish["weights_path"] is None  # defaults travel too
    CALLS["finish_trial"].arguments(finish)
    CALLS["register_replica"].arguments(sent("register_replica", 1, 0, 1, "node", 42, ("cuda:0",), 1.0))
    claim = new_claim(run_id=1, replica_id=2, replica_index=0, graph_hash="h", now=2.0, lease_s=600.0)
    assert CALLS["claim_trial"].arguments(sent("claim_trial", claim)) == {"claim": claim}
    diverged = dataclasses.replace(epoch_of(1, 3, 0), train_loss=math.nan)
    got = CALLS["record_epoch"].arguments(sent("record_epoch", diverged))["epoch"]
    assert math.isnan(got.train_loss) and dataclasses.replace(got, train_loss=0.0) == \
        dataclasses.replace(diverged, train_loss=0.0)
    assert CALLS["changes"].arguments(sent("changes", 1, 5, also=range(3))) == \
        {"run_id": 1, "after": 5, "also": [0, 1, 2]}
    assert CALLS["last_epoch_number"].arguments({}) == {}


def test_a_missing_argument_that_has_a_default_takes_it():
    assert CALLS["end_replica"].arguments({"replica_id": 1, "status": "stopped", "now": 2.0}) == \
        {"replica_id": 1, "status": "stopped", "now": 2.0, "reason": ""}


def test_values_come_back_as_their_declared_types():
    seg = SegmentRecord(run_id=1, index=0, started_at=1.0, deadline_at=2.0, last_seen=1.5,
                        ended_at=None)
    rep = ReplicaRecord(id=3, run_id=1, index=0, segment=0, host="n", pid=7, devices=["cpu"],
                        started_at=1.0, last_heartbeat=1.0, status="running")
    change = TrialChange(id=4, graph_hash="h", status="running", replica_index=0,
                         best_accuracy=None, predicted_accuracy=None, changed=9)
    for name, value in [("heartbeat", seg), ("heartbeat", None), ("segments", [seg]),
                        ("replica_changes", Changes(rows=[(5, rep)], through=5)),
                        ("changes", Changes(rows=[change], through=None)),
                        ("graphs", {4: "{}", 12: "[]"}), ("finish_trial", True),
                        ("epochs_after", [(1, 0, epoch_of(1, 4, 0))])]:
        call = CALLS[name]
        travelled = wire.decode(0, wire.encode(call.encode_value(value) if call.encode_value
                                               else value)[wire.HEADER.size:])
        assert (call.decode_value(travelled) if call.decode_value else travelled) == value, name


@pytest.mark.parametrize(("op", "args", "said"), [
    ("heartbeat", {"replica_id": 3}, "needs its argument 'now'"),
    ("heartbeat", {"replica_id": 3, "now": 1.0, "lease_s": 60.0, "x": 1}, "takes no argument 'x'"),
    ("heartbeat", [3, 1.0, 60.0], "travel by name"),
    ("heartbeat", {"replica_id": True, "now": 1.0, "lease_s": 60.0}, "replica_id is bool"),
    ("heartbeat", {"replica_id": 3, "now": "soon", "lease_s": 60.0},
     "now is str 'soon', not a number"),
    ("touch_segment", {"run_id": 1, "index": 2.0, "now": 3.0}, "index is float"),
    ("register_replica", {"run_id": 1, "index": 0, "segment": 1, "host": "node", "pid": 42,
                          "devices": ["cuda:0", 1], "now": 1.0}, "devices is list"),
    ("end_replica", {"replica_id": {"id": 1}, "status": "stopped", "now": 3.0}, "replica_id is dict"),
    ("add_samples", {"run_id": 1, "node": "n", "samples": [{"t": 1}, 2]}, "samples is list"),
    ("claim_trial", {"claim": [1, 2]}, "the Claim travels as a list of 11 values"),
    ("claim_trial", {"claim": [1, 2, 0, "h", "{}", None, [], "round", {}, 2.0, 600.0]},
     "Claim.round is str 'round'"),
    ("record_epoch", {"epoch": "epoch"}, "the EpochRecord travels as a list"),
])
def test_what_another_version_could_send_is_refused_in_one_line(op, args, said):
    with pytest.raises(CallError) as refused:
        CALLS[op].arguments(args)
    message = str(refused.value)
    assert said.lower() in message.lower() and "\n" not in message


def test_a_rule_on_a_hint_is_checked_and_named():
    share = Annotated[float, Rule(test=lambda v: math.isfinite(v) and 0 <= v <= 1,
                                  says="finite, from 0 to 1")]
    assert conforms(0.5, share) and conforms(1, share)
    assert not conforms(1.5, share) and not conforms(math.nan, share) and not conforms("1", share)
    assert conforms(None, share | None) and not conforms(2.0, share | None)
    assert named(share) == "a number (finite, from 0 to 1)"


def checked(op, *args, **kwargs):
    """``op``'s arguments as the service takes them, sent as a client of any version could:
    bound to the call's parameter names as they are, without the run's client's own types."""
    call = CALLS[op]
    return call.arguments({**call.defaults, **dict(zip(call.names, args)), **kwargs})


def test_times_come_as_numbers_of_either_kind_and_are_kept_as_floats():
    """A time sent as a whole number (``int(time.time())`` in another client) is a float by
    the time it is kept: the heartbeats' flush writes them all as one array of one type."""
    args = checked("heartbeat", 3, 1700000000, 60)
    assert args == {"replica_id": 3, "now": 1700000000.0, "lease_s": 60.0}
    assert [type(a) for a in args.values()] == [int, float, float]
    assert type(checked("finish_trial", 4, "completed", 3, best_accuracy=1)["best_accuracy"]) is float


BAD = float("nan"), float("inf"), -float("inf"), 1.0000001, -0.1


@pytest.mark.parametrize("accuracy", BAD)
def test_an_accuracy_that_is_not_from_0_to_1_is_refused_in_one_line(accuracy):
    for where in ("best_accuracy", "predicted_accuracy"):
        with pytest.raises(CallError) as refused:
            checked("finish_trial", 4, "completed", 3.0, **{where: accuracy})
        message = str(refused.value)
        assert message.startswith(f"finish_trial: {where} is float") and "\n" not in message
    diverged = dataclasses.replace(epoch_of(1, 3, 0), val_accuracy=accuracy)
    with pytest.raises(CallError, match="record_epoch: EpochRecord.val_accuracy is float"):
        checked("record_epoch", wire.pack(diverged))
    checked("finish_trial", 4, "completed", 3.0, best_accuracy=0, predicted_accuracy=1)  # the ends


CLAIM = [1, 2, 0, "h", "{}", None, [], 0, {}, 2.0, 600.0]


@pytest.mark.parametrize(("op", "args", "said"), [
    ("heartbeat", [3, math.nan, 60.0], "now is float 'nan', not a number (finite"),
    ("heartbeat", [3, math.inf, 60.0], "now is float 'inf'"),
    ("heartbeat", [3, 1.0, -5.0], "lease_s is float '-5.0', not a number (finite, from 0 to"),
    ("heartbeat", [-1, 1.0, 60.0], "replica_id is int '-1', not a whole number (finite, from 0"),
    ("changes", [1, 0, list(range(limits.MAX_IDS + 1))], "also is list"),
    ("graphs", [[1] * (limits.MAX_IDS + 1)], f"at most {limits.MAX_IDS} long"),
    ("epochs_after", [1, 2**63, []], "after is int"),
    ("register_replica", [1, 0, 1, "n" * 256, 4, [], 1.0], "host is str 'nnn"),
    ("register_replica", [1, 0, 1, "n\x00", 4, [], 1.0], "no NUL character"),
    ("register_replica", [1, 0, 1, "n", 4, ["cpu"] * (limits.MAX_DEVICES + 1), 1.0],
     "devices is list"),
    ("end_replica", [1, "vanished", 2.0, ""], "one of running, completed, failed, stopped"),
    ("finish_trial", [4, "won", 3.0, ""], "status is str 'won'"),
    ("add_samples", [1, "n", [{"cpu": 1}]], "with its time t, a finite number"),
    ("add_samples", [1, "n", [{"t": math.nan}]], "samples is list"),
    ("claim_trial", [CLAIM[:3] + ["h" * 65] + CLAIM[4:]], "Claim.graph_hash is str"),
    ("claim_trial", [CLAIM[:10] + [math.inf]], "Claim.lease_s is float 'inf', not a number (finite"),
])
def test_values_out_of_their_limits_are_refused_in_one_line(op, args, said):
    with pytest.raises(CallError) as refused:
        checked(op, *args)
    message = str(refused.value)
    assert message.startswith(op + ":") and said in message and "\n" not in message
    assert len(message) < 300


def test_where_a_time_may_never_come_it_may_be_infinite():
    checked("expire_leases", 1, math.inf)  # the primary's "every lease, whenever it ends"
    checked("start_segment", 1, 1.0, math.inf)
    with pytest.raises(CallError):
        checked("expire_leases", 1, math.nan)


def test_every_bound_is_written_on_stores_declaration():
    """The bounds live on Store's hints, one declaration per call: a time, an accuracy and a
    list of ids each carry their rule there, and CALLS reads it."""
    from automlperf.store.hints import Rule
    for op, name in [("heartbeat", "now"), ("finish_trial", "best_accuracy"), ("changes", "also"),
                     ("add_samples", "samples"), ("register_replica", "host")]:
        assert "Rule" in repr(CALLS[op].kinds[name]) or any(
            isinstance(m, Rule) for m in getattr(CALLS[op].kinds[name], "__metadata__", ())), (op, name)
