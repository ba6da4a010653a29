"""The store's contract has one declaration: each abstract method of Store (or RunRecords)
names a call's parameters, and every backend takes them by the same names and defaults: the
SQL store, the remote store, the service's handler where it has one (or the write of
store/writes.py it commits where it has none), and the exported records. The store's and
the trainer's records are keyword-only."""

import dataclasses
import inspect

import pytest

from automlperf import events
from automlperf.store import base
from automlperf.store.base import RunRecords, Store
from automlperf.store.records import ExportedRecords
from automlperf.store.service.calls import CALLS, LOCAL
from automlperf.store.service.client import RemoteStore
from automlperf.store.service.server import Service
from automlperf.store.sql import SQLStore
from automlperf.store.writes import Writes


def parameters(function, skip=1):
    """A function's parameters after its first ``skip`` (self, a connection): name, kind and
    default of each."""
    return [(p.name, p.kind, p.default)
            for p in list(inspect.signature(function).parameters.values())[skip:]]


def shown(params):
    return "(" + ", ".join(name if default is inspect.Parameter.empty else f"{name}={default!r}"
                           for name, _, default in params) + ")"


def mismatches(name, backends=(SQLStore, RemoteStore), service=Service):
    """How the backends' ``name`` differs from Store's declaration, one line each."""
    declared = parameters(getattr(Store, name))
    wrong = [f"{backend.__name__}.{name}{shown(found)}: Store declares {name}{shown(declared)}"
             for backend in backends
             if (found := parameters(getattr(backend, name))) != declared]
    if name in LOCAL:
        return wrong
    handler = getattr(service, f"op_{name}", None)
    if handler is not None:
        keyword = inspect.Parameter.KEYWORD_ONLY
        wanted = [(n, keyword, inspect.Parameter.empty) for n, _, _ in declared + [("again", 0, 0)]]
        if (found := parameters(handler)) != wanted:
            wrong.append(f"{service.__name__}.op_{name}{shown(found)}: Store declares "
                         f"{name}{shown(declared)}, each keyword-only, and again")
    elif hasattr(Writes, name):
        # Committed by the service as it is: the call's parameters, then ``retried``; the
        # call's value.
        write = getattr(Writes, name)
        found = parameters(write, skip=2)
        if [n for n, _, _ in found] != [n for n, _, _ in declared] + ["retried"]:
            wrong.append(f"Writes.{name}{shown(found)}: the service commits it for Store's "
                         f"{name}{shown(declared)}, and retried")
        if inspect.signature(write).return_annotation != \
                inspect.signature(getattr(Store, name)).return_annotation:
            wrong.append(f"Writes.{name} returns {inspect.signature(write).return_annotation}, "
                         f"the call {inspect.signature(getattr(Store, name)).return_annotation}")
    return wrong


@pytest.mark.parametrize("name", sorted(Store.__abstractmethods__))
def test_every_backend_takes_a_calls_parameters_by_the_names_store_declares(name):
    wrong = mismatches(name)
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_parameter_renamed_in_one_backend_only():
    class SQL(SQLStore):
        def end_segment(self, run_id: int, index: int, ended: float) -> None: ...

    class Served(Service):
        async def op_heartbeat(self, *, replica_id: int, now: float, lease: float,
                               again: bool) -> None: ...

    assert mismatches("end_segment", backends=(SQL, RemoteStore)) == [
        "SQL.end_segment(run_id, index, ended): Store declares end_segment(run_id, index, ended_at)"]
    assert mismatches("heartbeat", service=Served) == [
        "Served.op_heartbeat(replica_id, now, lease, again): Store declares heartbeat(replica_id, "
        "now, lease_s), each keyword-only, and again"]


@pytest.mark.parametrize("name", sorted(n for n in dir(Writes) if n in CALLS))
def test_a_write_named_after_a_call_takes_its_parameters_first(name):
    declared = [n for n, _, _ in parameters(getattr(Store, name))]
    found = [n for n, _, _ in parameters(getattr(Writes, name), skip=2)]
    assert found[:len(declared)] == declared, f"Writes.{name}{found}: Store declares {declared}"


@pytest.mark.parametrize("name", sorted(RunRecords.__abstractmethods__))
def test_the_exported_records_take_a_reads_parameters_by_the_same_names(name):
    declared = parameters(getattr(RunRecords, name))
    assert parameters(getattr(ExportedRecords, name)) == declared


@pytest.mark.parametrize("cls", [
    cls for module in (base, events) for cls in vars(module).values()
    if dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__],
    ids=lambda cls: cls.__name__)
def test_every_record_of_the_store_and_of_training_is_keyword_only(cls):
    positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]
    assert not positional, f"{cls.__name__} takes {positional} by position: @dataclass(kw_only=True)"
