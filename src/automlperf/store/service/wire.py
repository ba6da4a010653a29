"""The store service's protocol (store/service/server.py, store/service/client.py): frames of
JSON over one TCP connection, a request answered before the next is sent on the same
connection.

A frame is a 5-byte header (the payload's length, big-endian, and a flags byte: 1 when the
payload is zlib-compressed, as payloads over ``COMPRESS_OVER`` bytes are) and the payload.
The greeting proves each side holds the run's token without either sending it (so a process
that took a restarted service's port learns nothing and acknowledges nothing): the client
sends ``{"hello": PROTOCOL, "schema": SCHEMA_VERSION, "nonce": c}``; the service refuses
another protocol or schema in one line naming both, or answers ``{"nonce": s, "proof":
proof(token, "service", c, s)}``, which the client checks before it sends anything else;
the client answers ``{"proof": proof(token, "client", s, c)}`` and the service ``{"v": {...}}``
or an error, and closes. Then each request is
``{"op": name, "a": [arguments], "r": true when sent again after a lost answer}`` and each
answer ``{"v": value, "s": when the service last came back from an outage (0: never)}`` or
``{"e": kind, "m": message}`` (kind: ``store``, ``schema``, ``value``, ``protocol``).

Records travel as lists in their fields' order (``pack``/``unpack``), and so does a claim:
``claim_trial``'s one argument is a packed :class:`~automlperf.store.base.Claim`. A change to
what travels changes ``PROTOCOL``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import socket
import struct
import zlib
from typing import Any, TypeVar

from automlperf.store.base import (Claim, EpochRecord, ReplicaRecord, SegmentRecord,
                                   TrialChange, TrialRecord, TrialSummary, TrialTally)

# 2: a claim travels as a Claim record (one argument), no longer as 11 arguments: a client of
# protocol 1 is refused at its greeting rather than misread.
# 3: the greeting proves the token both ways instead of sending it.
PROTOCOL = 3
HEADER = struct.Struct("!IB")
COMPRESSED = 1
COMPRESS_OVER = 64 * 1024
# A frame larger than this is refused: a client that is not ours, or a broken stream. An
# answer (a whole history) may be large; a request is a call's arguments, and a greeting, read
# before anyone is known, a few fields, never compressed.
MAX_FRAME = 1 << 30
MAX_REQUEST = 64 << 20
MAX_GREETING = 4096
# What a compressed frame may inflate to: zlib turns 1 MiB into about 1 GiB of zeros.
MAX_INFLATED = 256 << 20

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
    return isinstance(claimed, str) and hmac.compare_digest(
        claimed, proof(token, side, first, second))


def greeting_refusal(hello: Any, schema: int) -> tuple[str, str] | None:
    """Why a client's greeting is refused (the error's kind and one line), or None."""
    if not isinstance(hello, dict) or hello.get("hello") != PROTOCOL:
        theirs = hello.get("hello") if isinstance(hello, dict) else None
        return "protocol", (f"this store service speaks protocol {PROTOCOL}, this client "
                            f"{'another' if theirs is None else str(theirs)[:20]}: use the "
                            "automlperf that started the run")
    if hello.get("schema") != schema:
        return "schema", (f"this store service serves schema version {schema}, this client "
                          f"reads version {str(hello.get('schema'))[:20]}: use the automlperf "
                          "that started the run")
    if not isinstance(hello.get("nonce"), str) or not NONCE.fullmatch(hello["nonce"]):
        return "protocol", "a greeting without its nonce (64 hexadecimal digits)"
    return None


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


def decode(flags: int, payload: bytes, inflated: int = MAX_INFLATED) -> Any:
    """A frame's message; :class:`ProtocolError` for one that is not this protocol's (not
    zlib, not JSON, or inflating past ``inflated`` bytes)."""
    try:
        if flags & COMPRESSED:
            inflater = zlib.decompressobj()
            payload = inflater.decompress(payload, inflated)
            if inflater.unconsumed_tail or not inflater.eof:
                raise ProtocolError(f"a compressed frame inflating past {inflated} bytes "
                                    "(or cut short)")
        return json.loads(payload)
    except (zlib.error, ValueError) as exc:  # ValueError: JSON's and UTF-8's
        raise ProtocolError(f"a frame that is not this protocol's ({str(exc)[:100]})") from None


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
    return decode(flags, _exactly(sock, length)), HEADER.size + length


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the store service closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- records as lists ----------------------------------------------------------------------
# Each record's fields in the order they travel (a trial's change leads with its number).
FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls))
    for cls in (SegmentRecord, ReplicaRecord, TrialRecord, TrialSummary, TrialTally, EpochRecord,
                Claim)}
FIELDS[TrialChange] = ("changed", *FIELDS[TrialSummary])


def pack(record: Any) -> list[Any]:
    """A record as the list that travels: its fields' values in ``FIELDS`` order."""
    return [getattr(record, name) for name in FIELDS[type(record)]]


def unpack(cls: type[T], values: list[Any]) -> T:
    """The record ``pack`` made ``values`` of, built by its fields' names."""
    names = FIELDS[cls]
    if len(values) != len(names):
        raise ValueError(f"a {cls.__name__} travels as {len(names)} values, not {len(values)}")
    return cls(**dict(zip(names, values)))
