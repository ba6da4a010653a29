"""The store service's protocol (store/service/server.py, store/service/client.py): frames of
JSON over one TCP connection, a request answered before the next is sent on the same
connection.

A frame is a 5-byte header (the payload's length, big-endian, and a flags byte: 1 when the
payload is zlib-compressed, as payloads over ``COMPRESS_OVER`` bytes are) and the payload.
The greeting proves each side holds the run's token without either sending it (so a process
that took a restarted service's port learns nothing and acknowledges nothing): the client
sends ``{"hello": PROTOCOL, "schema": SCHEMA_VERSION, "nonce": c}``; the service answers
``{"nonce": s, "proof": proof(token, "service", c, s)}``, which the client checks before it
sends anything else, or refuses another protocol or schema in one line naming both, proven
as ``refusal_proof`` (which covers the refusal's words: a process on the service's port
cannot make a client give up, however it answers); the client answers ``{"proof":
proof(token, "client", s, c)}``, and the primary adds ``"primary": proof(primary token,
"primary", s, c)`` (the calls only the primary makes, store/service/calls.py); the service
answers ``{"v": {...}}`` or an error, and closes. Then each request is
``{"op": name, "a": {parameter: argument}, "r": true when sent again after a lost answer}``
(the call's parameters as :class:`~automlperf.store.base.Store` names them) and each answer
``{"v": value, "s": when the service last came back from an outage (0: never)}`` or
``{"e": kind, "m": message}`` (kind: ``store``, ``schema``, ``value``, ``protocol``).

Records travel as lists in their fields' order (``pack``/``unpack``): ``claim_trial``'s one
argument is a packed :class:`~automlperf.store.base.Claim`, ``heartbeat``'s value a packed
:class:`~automlperf.store.base.SegmentRecord`. What else turns into JSON and back follows the
declared types (``encoder``, ``decoder``). A change to what travels changes ``PROTOCOL``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import hashlib
import hmac
import json
import operator
import re
import secrets
import socket
import struct
import types
import typing
import zlib
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union

from automlperf.store.hints import field_hints

# 2: a claim travels as a Claim record (one argument), no longer as 11 arguments: a client of
# protocol 1 is refused at its greeting rather than misread.
# 3: the greeting proves the token both ways instead of sending it.
# 4: a call's arguments travel by name (an object), no longer in order (a list); a trial's
# change in its record's own field order; a dict with whole-number keys as an object.
# 5: a refusal at the greeting is proven (a client trusts no other), and the primary proves a
# second token of its own.
PROTOCOL = 5
HEADER = struct.Struct("!IB")
COMPRESSED = 1
COMPRESS_OVER = 64 * 1024
# A frame larger than this is refused: a client that is not ours, or a broken stream. An
# answer (a whole history) may be large; a request is a call's arguments, and a greeting, read
# before anyone is known, a few fields, never compressed. A compressed frame inflates to at
# most its own limit (zlib turns 1 MiB into about 1 GiB of zeros).
MAX_FRAME = 1 << 30
# The largest call is a node's samples (store/limits.py MAX_SAMPLES of them, about 3 KB each
# for 16 GPUs): a request parsed on the service's one event loop holds it a second or so at
# this size, where 64 MiB held it 11 s (bench/RESULTS.md, "A run attacked").
MAX_REQUEST = 8 << 20
MAX_GREETING = 4096
# How much a compressed frame is inflated at a time: what it takes beyond its limit.
INFLATE_STEP = 1 << 20

T = TypeVar("T")


class ProtocolError(ConnectionError):
    """The other side does not speak this protocol (or the stream broke mid-frame)."""


NONCE = re.compile(r"[0-9a-f]{64}")


def nonce() -> str:
    """A fresh challenge: what makes each greeting's proofs good for that greeting only."""
    return secrets.token_hex(32)


def proof(token: str, side: str, first: str, second: str) -> str:
    """What shows that ``side`` holds the run's token: the token's HMAC of both nonces, the
    prover's peer's first. The side names differ, so no proof can be sent back as the other's."""
    return hmac.new(token.encode(), f"{side}|{first}|{second}".encode(),
                    hashlib.sha256).hexdigest()


def proves(token: str, side: str, first: str, second: str, claimed: Any) -> bool:
    """Whether ``claimed`` is ``side``'s proof; any value another process sent (not a string,
    not ASCII) is simply not one."""
    return isinstance(claimed, str) and hmac.compare_digest(
        claimed.encode("utf-8", "replace"), proof(token, side, first, second).encode())


def refusal_proof(token: str, kind: str, message: str, client: str, service: str) -> str:
    """The service's proof of a refusal at the greeting: its words included, so that nothing
    but the service can refuse a client in its name."""
    return proof(token, f"refusal {kind} {message}", client, service)


def greeting_refusal(hello: Any, schema: int) -> tuple[str, str] | None:
    """Why a client's greeting is refused (the error's kind and one line), or None."""
    if not isinstance(hello, dict) or hello.get("hello") != PROTOCOL:
        theirs = hello.get("hello") if isinstance(hello, dict) else None
        return "protocol", (f"this store service speaks protocol {PROTOCOL}, this client "
                            f"{'another' if theirs is None else shown(theirs)}: use the "
                            "automlperf that started the run")
    if hello.get("schema") != schema:
        return "schema", (f"this store service serves schema version {schema}, this client "
                          f"reads version {shown(hello.get('schema'))}: use the automlperf "
                          "that started the run")
    if not isinstance(hello.get("nonce"), str) or not NONCE.fullmatch(hello["nonce"]):
        return "protocol", "a greeting without its nonce (64 hexadecimal digits)"
    return None


def shown(value: Any, size: int = 20) -> str:
    """A value another process sent, as a log line or a message may repeat it: short, and
    printable (no newline of its own)."""
    text = value if isinstance(value, str) else repr(value)
    return ascii(text[:size])[1:-1]


def keepalive(sock: Any) -> None:
    """TCP keepalive: a peer that vanished (a node powered off, a cable pulled) is noticed
    in about two minutes instead of holding its connection for hours."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def encode(message: Any) -> bytes:
    return encode_text(json.dumps(message, separators=(",", ":")))


class Encoded(str):
    """A value already written as JSON text (a long list put together from rows encoded
    once): the answer carries it as it is."""


def answer(value: Any, came_back: float) -> bytes:
    """The frame answering a call with ``value``."""
    if isinstance(value, Encoded):
        return encode_text(f'{{"v":{value},"s":{json.dumps(came_back)}}}')
    return encode({"v": value, "s": came_back})


def encode_text(text: str) -> bytes:
    data = text.encode()
    flags = 0
    if len(data) > COMPRESS_OVER:
        data, flags = zlib.compress(data, 1), COMPRESSED
    return HEADER.pack(len(data), flags) + data


def decode(flags: int, payload: bytes, inflated: int = MAX_FRAME) -> Any:
    """A frame's message; :class:`ProtocolError` for one that is not this protocol's (not
    zlib, not JSON, or inflating past ``inflated`` bytes, which it never holds more than a
    step beyond: zlib's own bound grows its buffer by doubling, to twice that)."""
    try:
        if flags & COMPRESSED:
            inflater = zlib.decompressobj()
            out = bytearray()
            left: bytes = payload
            while left and not inflater.eof:
                out += inflater.decompress(left, INFLATE_STEP)
                left = inflater.unconsumed_tail
                if len(out) > inflated:
                    raise ProtocolError(f"a compressed frame inflating past {inflated} bytes")
            if not inflater.eof:
                raise ProtocolError("a compressed frame cut short")
            return json.loads(out)
        return json.loads(payload)
    except (zlib.error, ValueError, RecursionError, TypeError) as exc:
        # ValueError: JSON's and UTF-8's; RecursionError: JSON nested a thousand deep.
        raise ProtocolError(f"a frame that is not this protocol's "
                            f"({type(exc).__name__}: {str(exc)[:100]})") from None


def check_header(length: int, flags: int, limit: int, compressed: bool = True) -> None:
    """Refuse a frame before reading it: longer than ``limit``, or compressed where it may
    not be."""
    if length > limit:
        raise ProtocolError(f"a frame of {length} bytes (at most {limit} here)")
    if flags & COMPRESSED and not compressed:
        raise ProtocolError("a compressed frame where none may be")


def read_frame(sock: socket.socket, limit: int = MAX_FRAME) -> tuple[Any, int]:
    """The next message on a blocking socket, and the bytes it took on the wire."""
    length, flags = HEADER.unpack(_exactly(sock, HEADER.size))
    check_header(length, flags, limit)
    return decode(flags, _exactly(sock, length), limit), HEADER.size + length


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the store service closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- values as they travel ------------------------------------------------------------------
# A record (any dataclass) travels as the list of its fields' values, in their order; a
# call's arguments and its value are turned into JSON and back by their declared types
# (``encoder``, ``decoder``: store/service/calls.py reads them off Store's signatures).
Convert = Callable[[Any], Any]


def is_record(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


_FIELDS: dict[type, tuple[str, ...]] = {}


def fields_of(cls: type) -> tuple[str, ...]:
    """A record's fields, in the order they travel: its own."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return found


def pack(record: Any) -> list[Any]:
    """A record as the list that travels: its fields' values in their order."""
    return [getattr(record, name) for name in fields_of(type(record))]


def unpack(cls: type[T], values: Any) -> T:
    """The record ``pack`` made ``values`` of, built by its fields' names."""
    names = fields_of(cls)
    if not isinstance(values, list) or len(values) != len(names):
        raise ValueError(f"a {cls.__name__} travels as a list of {len(names)} values")
    return cls(**dict(zip(names, values)))


@functools.cache
def encoder(kind: Any) -> Convert | None:
    """How a value of type ``kind`` becomes what travels (None: as it is): a record packed,
    records inside lists, tuples, dicts or a generic record (``Changes[TrialChange]``) too,
    any sequence a list."""
    kind = _plain(kind)
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        return _optional(kind, [encoder(a) for a in params if a is not type(None)])
    if is_record(origin or kind):
        converts = [(name, encoder(hint)) for name, hint in _field_kinds(kind).items()]
        if all(c is None for _, c in converts):
            return pack
        return lambda v: [getattr(v, n) if c is None else c(getattr(v, n)) for n, c in converts]
    if origin in (list, collections.abc.Sequence):
        item = encoder(params[0]) if params else None
        if item is pack and len(fields_of(params[0])) > 1:
            # A list of records (a history's summaries): each packed in one step.
            get = operator.attrgetter(*fields_of(params[0]))
            return lambda v: [list(get(x)) for x in v]
        if item is not None:
            return lambda v: [item(x) for x in v]
        return _listed if origin is collections.abc.Sequence else None
    if origin is tuple:
        items = [encoder(a) for a in params]
        return lambda v: [x if c is None else c(x) for x, c in zip(v, items)]
    if origin is dict and params and encoder(params[1]) is not None:
        value = encoder(params[1])
        return lambda v: {k: value(x) for k, x in v.items()}  # type: ignore[misc]
    return None


@functools.cache
def decoder(kind: Any) -> Convert | None:
    """How what travels becomes a value of type ``kind`` (None: as it is): ``encoder``
    undone, and a dict's whole-number keys, which JSON makes strings, whole numbers again."""
    kind = _plain(kind)
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        return _optional(kind, [decoder(a) for a in params if a is not type(None)])
    if is_record(origin or kind):
        cls = origin or kind
        converts = [(name, decoder(hint)) for name, hint in _field_kinds(kind).items()]
        if all(c is None for _, c in converts):
            return functools.partial(unpack, cls)
        return lambda v: cls(**{n: x if c is None else c(x)
                                for (n, c), x in zip(converts, _values(cls, v))})
    if origin in (list, collections.abc.Sequence):
        item = decoder(params[0]) if params else None
        if isinstance(item, functools.partial) and item.func is unpack:
            return functools.partial(_records, _record_class(params[0]))
        return None if item is None else lambda v: [item(x) for x in v]
    if origin is tuple:
        items = [decoder(a) for a in params]
        return lambda v: tuple(x if c is None else c(x) for x, c in zip(v, items))
    if origin is dict and params:
        key, value = (int if params[0] is int else None), decoder(params[1])
        if key is not None or value is not None:
            return lambda v: {k if key is None else key(k): x if value is None else value(x)
                              for k, x in v.items()}
    return None


def _records(cls: type, rows: Any) -> list[Any]:
    """``unpack`` of each of ``rows``, in one step."""
    names = fields_of(cls)
    if not all(isinstance(row, list) and len(row) == len(names) for row in rows):
        raise ValueError(f"a {cls.__name__} travels as a list of {len(names)} values")
    return [cls(**dict(zip(names, row))) for row in rows]


def _record_class(kind: Any) -> type:
    """The class of the record type ``kind`` (``Changes`` of ``Changes[TrialChange]``)."""
    kind = _plain(kind)
    return typing.get_origin(kind) or kind


def _plain(kind: Any) -> Any:
    """``kind`` without the rules of an ``Annotated`` hint (store/hints.py)."""
    return typing.get_args(kind)[0] if typing.get_origin(kind) is Annotated else kind


def _optional(kind: Any, converts: list[Convert | None]) -> Convert | None:
    if all(c is None for c in converts):
        return None
    if len(converts) != 1:
        raise TypeError(f"{kind} cannot travel: which of its types a value is would be a guess")
    convert = converts[0]
    return lambda v: None if v is None else convert(v)  # type: ignore[misc]


def _listed(values: Any) -> list[Any]:
    return values if type(values) is list else list(values)


def _values(cls: type, values: Any) -> list[Any]:
    if not isinstance(values, list) or len(values) != len(fields_of(cls)):
        raise ValueError(f"a {cls.__name__} travels as a list of {len(fields_of(cls))} values")
    return values


def _field_kinds(kind: Any) -> dict[str, Any]:
    """A record's fields' hints; a generic record's (``Changes[TrialChange]``) with its type
    parameters filled in."""
    cls, params = typing.get_origin(kind) or kind, typing.get_args(kind)
    hints = field_hints(cls)
    if not params:
        return hints
    given = dict(zip(getattr(cls, "__parameters__", ()), params))

    def filled(hint: Any) -> Any:
        if isinstance(hint, TypeVar):
            return given[hint]
        free = getattr(hint, "__parameters__", ())
        return hint[tuple(given[p] for p in free)] if free else hint

    return {name: filled(hint) for name, hint in hints.items()}
