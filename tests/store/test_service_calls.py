"""The store service's call signatures (store/service/calls.py): every call has one, what
the run's own client sends conforms, and what another version could send does not."""

import dataclasses
import math

import pytest

from automlperf.store.service import server, wire
from automlperf.store.service.calls import SIGNATURES, CallError, check_call
from helpers import epoch_of, new_claim


def test_every_call_of_the_service_has_its_signature():
    ops = {name[3:] for name in dir(server.Service) if name.startswith("op_")}
    assert ops == set(SIGNATURES)


def test_what_the_client_sends_conforms():
    check_call("heartbeat", [3, 1.5, 60])
    check_call("expire_leases", [1, math.inf])
    check_call("finish_trial", [4, "completed", 3.0, "", 0.5, None, None, {"k": 1}])
    check_call("register_replica", [1, 0, 1, "node", 42, ["cuda:0"], 1.0])
    check_call("claim_trial", [wire.pack(new_claim(run_id=1, replica_id=2, replica_index=0,
                                                   graph_hash="h", now=2.0, lease_s=600.0))])
    diverged = dataclasses.replace(epoch_of(1, 3, 0), train_loss=math.nan)
    check_call("record_epoch", [wire.pack(diverged)])
    check_call("last_epoch_number", [])


@pytest.mark.parametrize(("op", "args", "said"), [
    ("heartbeat", [3], "takes 3 arguments, not 1"),
    ("heartbeat", [3, 1.0, 60.0, 1], "takes 3 arguments, not 4"),
    ("heartbeat", [True, 1.0, 60.0], "argument 1 is bool"),
    ("heartbeat", [3, "soon", 60.0], "argument 2 is str 'soon', not a number"),
    ("touch_segment", [1, 2.0, 3.0], "argument 2 is float"),
    ("register_replica", [1, 0, 1, "node", 42, ["cuda:0", 1], 1.0], "argument 6"),
    ("end_replica", [{"id": 1}, "stopped", 3.0, ""], "argument 1 is dict"),
    ("claim_trial", [[1, 2]], "the Claim travels as a list of 11 values"),
    ("claim_trial", [[1, 2, 0, "h", "{}", None, [], "round", {}, 2.0, 600.0]],
     "Claim.round is str 'round'"),
    ("record_epoch", ["epoch"], "the EpochRecord travels as a list"),
])
def test_what_another_version_could_send_is_refused_in_one_line(op, args, said):
    with pytest.raises(CallError) as refused:
        check_call(op, args)
    message = str(refused.value)
    assert said.lower() in message.lower() and "\n" not in message
