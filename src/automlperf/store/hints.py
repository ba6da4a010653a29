"""Whether a JSON value is what a type hint says: the check the store service applies to a
call's arguments (store/service/calls.py, from :class:`~automlperf.store.base.Store`'s
signatures) and the exported records apply to their fields (store/records.py, from the
records' own hints), so that neither keeps a table of types beside the declarations.

A hint may carry rules: ``Annotated[float, Rule(...)]`` is a number that each rule also
passes (a range, a length), checked after the type."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Union


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """A condition beyond the type, in an ``Annotated`` hint: ``test`` takes a value of the
    type and says whether it passes; ``says`` names it for the one-line refusal ("from 0 to
    1")."""

    test: Callable[[Any], bool]
    says: str


@functools.cache
def field_hints(cls: Any) -> dict[str, Any]:
    """A record's fields and their hints, rules included, in the fields' order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def conforms(value: Any, kind: Any, record: bool = False) -> bool:
    """Whether the JSON ``value`` is of ``kind`` (a type, ``X | None``, ``list[X]``, a
    ``Sequence[X]`` or a ``tuple[...]`` as a JSON list, ``Annotated[X, Rule, ...]``). A
    ``record``'s counts may have been computed as whole floats."""
    return checker(kind, record)(value)


Check = Callable[[Any], bool]


@functools.cache
def checker(kind: Any, record: bool = False) -> Check:
    """:func:`conforms` for one ``kind``, worked out once: a bundle's half a million epochs,
    each field checked, and every call the store service takes go through it."""
    if kind is Any:
        return _anything
    if kind is None or kind is type(None):
        return _none
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        base = checker(params[0], record)
        rules = tuple(r.test for r in params[1:] if isinstance(r, Rule))
        return lambda v: base(v) and all(test(v) for test in rules)
    if origin in (Union, types.UnionType):
        parts = tuple(checker(k, record) for k in params)
        return lambda v: any(part(v) for part in parts)
    if origin in (list, collections.abc.Sequence):
        item = checker(params[0], record) if params else _anything
        if item is _anything:
            return _list
        return lambda v: isinstance(v, list) and all(map(item, v))
    if origin is tuple:
        items = tuple(checker(k, record) for k in params)
        return lambda v: isinstance(v, list) and len(v) == len(items) and all(
            item(x) for item, x in zip(items, v))
    if origin is dict or kind is dict:
        return _dict
    if kind is int:
        return _whole_or_integral if record else _whole
    # inf and NaN are numbers: "every lease, whenever it ends", a diverged loss
    return {bool: _bool, float: _number, str: _str, list: _list}.get(kind, _anything)


def _anything(value: Any) -> bool:
    return True  # Any, or a kind no call sends: the call's own code decides


def _none(value: Any) -> bool:
    return value is None


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole_or_integral(value: Any) -> bool:
    return _whole(value) or isinstance(value, float) and value.is_integer()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _list(value: Any) -> bool:
    return isinstance(value, list)


def _dict(value: Any) -> bool:
    return isinstance(value, dict)


def named(kind: Any) -> str:
    """``kind`` as a refusal names it: "a whole number", "a number (from 0 to 1)"."""
    if typing.get_origin(kind) is Annotated:
        base, *rules = typing.get_args(kind)
        said = "; ".join(r.says for r in rules if isinstance(r, Rule))
        return f"{named(base)} ({said})" if said else named(base)
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " or ".join("null" if k is type(None) else named(k) for k in typing.get_args(kind))
    if typing.get_origin(kind) in (list, collections.abc.Sequence):
        return "a list" + (f", each {named(typing.get_args(kind)[0])}," if typing.get_args(kind) else "")
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false",
            dict: "an object", list: "a list"}.get(kind, str(kind).replace("typing.", ""))


def shown(value: Any) -> str:
    """A value as a refusal shows it: its type and the start of its text."""
    return f"{type(value).__name__} {str(value)[:40]!r}"
