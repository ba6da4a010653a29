"""What each call of the store service takes (store/service/server.py), checked before the call
touches the service's memory or a transaction: a client of another version, or a broken one,
gets one line naming the argument, and nothing it sent is kept to fail a later write (a
heartbeat flushed with the others, a claim held in the run's state).

Arguments are JSON: a count is an int (not a bool), a time or a figure an int or a float
(NaN and infinity included: a diverged loss, a deadline that never comes); a record travels
as the list :func:`~automlperf.store.service.wire.pack` made, each value checked against its
field's type."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Union

from automlperf.store.base import Claim, EpochRecord
from automlperf.store.service import wire

NUM = float
OPT_NUM = float | None
# Each call's arguments, in order (the client's side: store/service/client.py).
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "open": (),
    "create_run": (str, dict, dict, NUM, NUM),
    "run": (int,),
    "extend_run": (int, NUM, dict, dict),
    "start_segment": (int, NUM, NUM),
    "touch_segment": (int, int, NUM),
    "end_segment": (int, int, NUM),
    "segments": (int,),
    "register_replica": (int, int, int, str, int, list[str], NUM),
    "heartbeat": (int, NUM, NUM),
    "end_replica": (int, str, NUM, str),
    "replicas": (int,),
    "replica_changes": (int, int, list[int]),
    "silent_replicas": (int, NUM),
    "claim_trial": (Claim,),
    "finish_trial": (int, str, NUM, str, OPT_NUM, OPT_NUM, str | None, dict | None),
    "expire_leases": (int, NUM),
    "trial": (int,),
    "trials": (int, int),
    "tally": (int,),
    "summaries": (int,),
    "changes": (int, int, list[int]),
    "graphs": (list[int],),
    "record_epoch": (EpochRecord,),
    "epochs": (int,),
    "epochs_after": (int, int, list[int]),
    "last_epoch_number": (),
    "add_samples": (int, str, list),
    "samples": (int,),
    "record_node": (int, int, int, str, dict, NUM),
    "nodes": (int,),
}


class CallError(ValueError):
    """A call whose arguments are not what its name takes."""


def check_call(op: str, args: list[Any]) -> None:
    """Raise :class:`CallError` unless ``args`` are what ``op`` takes."""
    wanted = SIGNATURES[op]
    if len(args) != len(wanted):
        raise CallError(f"{op} takes {len(wanted)} arguments, not {len(args)}: use the "
                        "automlperf that started the run")
    for i, (value, kind) in enumerate(zip(args, wanted)):
        if kind in wire.FIELDS:
            _check_record(op, kind, value)
        elif not conforms(value, kind):
            raise CallError(f"{op}: argument {i + 1} is {_shown(value)}, not {_name(kind)}")


def _check_record(op: str, cls: type, value: Any) -> None:
    hints = _hints(cls)
    names = wire.FIELDS[cls]
    if not isinstance(value, list) or len(value) != len(names):
        raise CallError(f"{op}: the {cls.__name__} travels as a list of {len(names)} values")
    for name, field_value in zip(names, value):
        if not conforms(field_value, hints[name], record=True):
            raise CallError(f"{op}: {cls.__name__}.{name} is {_shown(field_value)}, not "
                            f"{_name(hints[name])}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def conforms(value: Any, kind: Any, record: bool = False) -> bool:
    """Whether the JSON ``value`` is of ``kind`` (a type, ``X | None``, ``list[X]``, ...). A
    ``record``'s counts may have been computed as whole floats."""
    if kind is Any:
        return True
    if kind is None or kind is type(None):
        return value is None
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return any(conforms(value, k, record) for k in typing.get_args(kind))
    if origin is list:
        (item,) = typing.get_args(kind) or (Any,)
        return isinstance(value, list) and all(conforms(v, item, record) for v in value)
    if origin is dict or kind is dict:
        return isinstance(value, dict)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return number and (isinstance(value, int) or record and float(value).is_integer())
    if kind is float:
        return number  # inf included: "every lease, whenever it ends"
    if kind is str:
        return isinstance(value, str)
    if kind is list:
        return isinstance(value, list)
    return True  # a kind no call sends: the call's own code decides


def _name(kind: Any) -> str:
    return {int: "a whole number", float: "a number", str: "a string",
            dict: "an object", list: "a list"}.get(kind, str(kind).replace("typing.", ""))


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {str(value)[:40]!r}"
