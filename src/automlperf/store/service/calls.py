"""The store service's calls, read off :class:`~automlperf.store.base.Store`: each abstract
method of ``Store`` but ``close`` is a call of its name, whose arguments travel by its
parameters' names, are checked against their hints, and whose value travels as its declared
return type says (store/service/wire.py ``encoder``, ``decoder``). No call is listed here:
``CALLS`` is derived when the module loads, and the client (store/service/client.py) and the
service (store/service/server.py) both use it.

The service checks a call's arguments before the call touches its memory or a transaction: a
client of another version, or a broken one, gets one line naming the argument, and nothing it
sent is kept to fail a later write (a heartbeat flushed with the others, a claim held in the
run's state). Arguments are JSON: a count is an int (not a bool), a time or a figure an int or
a float (NaN and infinity included: a diverged loss, a deadline that never comes); a record
travels as the list :func:`~automlperf.store.service.wire.pack` made, each value checked
against its field's hint. A hint's rules (``Annotated[float, Rule(...)]``, store/hints.py)
are checked with it: a bound on a call's argument is written on ``Store``'s signature (the
kinds of store/limits.py: finite times, accuracies from 0 to 1, bounded lists and strings,
known statuses), and on ``Claim``'s fields; an epoch's, whose record is the trainer's event
(events.py, which knows no store), in ``FIELD_LIMITS``. A time sent as a whole number is
kept as a float (the heartbeats' flush writes them as one array of one type)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union

from automlperf.store import limits
from automlperf.store.base import EpochRecord, Store
from automlperf.store.hints import Check, checker, field_hints, named, shown
from automlperf.store.service import wire

# Store's methods that are no calls: each process closes its own store.
LOCAL = frozenset({"close"})

# The calls only the primary makes (a connection that proved the primary's token, which the
# replicas never hold): a broken replica cannot fail every running trial, rewrite the run or
# end its session.
PRIMARY_ONLY = frozenset({"create_run", "extend_run", "start_segment", "touch_segment",
                          "end_segment", "expire_leases"})

# The bounds of an epoch's fields over their types (a field not named: its type alone).
FIELD_LIMITS: dict[type, dict[str, Any]] = {
    EpochRecord: {"run_id": limits.Id, "trial_id": limits.Id, "epoch": limits.Id,
                  "started_at": limits.Time, "ended_at": limits.Time,
                  "train_images": limits.Number, "val_images": limits.Number,
                  "steps": limits.Number, "ops": limits.Number,
                  "val_accuracy": limits.Accuracy, "precision": limits.Hash,
                  "batch_size": limits.Id, "world_size": limits.Id,
                  "skipped_images": limits.Number, "val_skipped": limits.Number,
                  "decode_path": limits.Text, "cpu_decoded": limits.Number},
}


class CallError(ValueError):
    """A call whose arguments are not what its name takes."""


@dataclass(frozen=True, kw_only=True)
class Call:
    """One call as its declaration says: its parameters (their hints, the defaults of those
    that have one) and what it returns, with the conversions to and from what travels."""

    name: str
    signature: inspect.Signature  # without ``self``
    names: tuple[str, ...]
    kinds: dict[str, Any]
    defaults: dict[str, Any]
    returns: Any
    encode: dict[str, wire.Convert]  # the parameters whose values do not travel as they are
    decode: dict[str, wire.Convert]
    encode_value: wire.Convert | None
    decode_value: wire.Convert | None
    checks: dict[str, Check]  # each parameter's check (hints.checker), worked out once

    @classmethod
    def of(cls, name: str, method: Callable[..., Any]) -> Call:
        signature = inspect.signature(method)
        params = list(signature.parameters.values())[1:]
        hints = typing.get_type_hints(method, include_extras=True)
        kinds = {p.name: hints[p.name] for p in params}
        returns = hints["return"]
        if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
            raise TypeError(f"the store's call {name} takes a parameter that is not "
                            "positional-or-keyword")
        return cls(name=name, signature=signature.replace(parameters=params),
                   names=tuple(kinds), kinds=kinds,
                   defaults={p.name: p.default for p in params if p.default is not p.empty},
                   returns=returns,
                   encode={p: c for p, k in kinds.items() if (c := wire.encoder(k)) is not None},
                   decode={p: c for p, k in kinds.items()
                           if (c := _as_float(k) or wire.decoder(k)) is not None},
                   encode_value=wire.encoder(returns), decode_value=wire.decoder(returns),
                   checks={p: _record_check(name, k) if wire.is_record(k) else checker(k)
                           for p, k in kinds.items()})

    def sent(self, *positional: Any, **named: Any) -> dict[str, Any]:
        """A Python call's arguments as they travel: bound by the call's signature (its
        parameters are all positional-or-keyword, as Store's are), and sent by name, every one
        (defaults too)."""
        names = self.names
        bound = dict(zip(names, positional))
        if len(positional) > len(names) or any(n in bound or n not in self.kinds for n in named):
            self.signature.bind(*positional, **named)  # Python's own TypeError
        bound.update(named)
        if len(bound) < len(names):
            for name in names:
                if name not in bound:
                    if name not in self.defaults:
                        self.signature.bind(*positional, **named)
                    bound[name] = self.defaults[name]
        for name, convert in self.encode.items():
            bound[name] = convert(bound[name])
        return bound

    def arguments(self, sent: Any) -> dict[str, Any]:
        """What a client sent, checked, as the call's handler takes it (a missing argument
        that has a default takes it; records built); :class:`CallError` in one line unless
        it is what the call takes."""
        if not isinstance(sent, dict):
            raise CallError(f"{self.name}'s arguments travel by name, as an object: use the "
                            "automlperf that started the run")
        if sent.keys() != self.kinds.keys():
            unknown = [name for name in sent if name not in self.kinds]
            if unknown:
                raise CallError(f"{self.name} takes no argument {str(unknown[0])[:40]!r} (it "
                                f"takes {', '.join(self.kinds) or 'none'}): use the automlperf "
                                "that started the run")
            missing = [name for name in self.kinds if name not in sent and name not in self.defaults]
            if missing:
                raise CallError(f"{self.name} needs its argument {missing[0]!r}: use the "
                                "automlperf that started the run")
            sent = {**self.defaults, **sent}
        checks = self.checks
        for name, value in sent.items():
            if not checks[name](value):
                kind = self.kinds[name]
                raise CallError(f"{self.name}: {name} is {shown(value)}, not {named(kind)}")
        for name, convert in self.decode.items():
            sent[name] = convert(sent[name])
        return sent


def _record_check(op: str, cls: type) -> Check:
    """A packed record's check: its length, each value against its field's hint; a refusal
    names the field."""
    hints = {**field_hints(cls), **FIELD_LIMITS.get(cls, {})}
    fields = [(name, kind, checker(kind, record=True)) for name, kind in hints.items()]

    def check(value: Any) -> bool:
        if not isinstance(value, list) or len(value) != len(fields):
            raise CallError(f"{op}: the {cls.__name__} travels as a list of {len(fields)} values")
        for (name, kind, passes), field_value in zip(fields, value):
            if not passes(field_value):
                raise CallError(f"{op}: {cls.__name__}.{name} is {shown(field_value)}, not "
                                f"{named(kind)}")
        return True

    return check


def _as_float(kind: Any) -> wire.Convert | None:
    """A number's conversion to a float (None: ``kind`` is no number): JSON's whole numbers
    come as ints."""
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return _as_float(params[0])
    if origin in (Union, types.UnionType) and type(None) in params and len(params) == 2:
        inner = _as_float(next(p for p in params if p is not type(None)))
        return None if inner is None else _float_or_none
    return float if kind is float else None


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _open(self: Any) -> int:
    """The schema version the service serves: what a client's open checks (the service's
    own call, no store's)."""
    raise NotImplementedError


def _calls() -> dict[str, Call]:
    calls = {name: Call.of(name, getattr(Store, name))
             for name in sorted(Store.__abstractmethods__) if name not in LOCAL}
    calls["open"] = Call.of("open", _open)
    return calls


CALLS = _calls()
