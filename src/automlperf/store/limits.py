"""What a store call's values may be beyond their JSON type: the ranges, lengths and words a
client of the store service must keep to, checked before anything it sent is kept. Each is an
``Annotated`` hint whose rules are store/hints.py ``Rule``s, written on ``Store``'s
declarations (store/base.py) and on ``Claim``'s fields, so a signature states a bound where it
states the type; store/service/calls.py checks them with the type.

The limits are what the store's consumers rely on: a NaN accuracy would reach every replica's
Gaussian-process fit (which refuses it) and stay in the database across resumes; a time that
is not a finite number would expire live leases or none; a string longer than its column, or
holding a NUL, fails in the database and sends the whole group commit back to one
transaction per call; a list of millions makes one call hold the service's event loop."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

from automlperf.events import TrialStatus
from automlperf.store.hints import Rule


def within(low: float, high: float, infinite: bool = False) -> Rule:
    """A finite number from ``low`` to ``high``, both included; ``infinite``: also +inf (a
    time that never comes: "every lease, whenever it ends")."""
    def test(value: Any) -> bool:
        return (infinite and value == math.inf) or (math.isfinite(value) and low <= value <= high)

    return Rule(test=test, says=f"finite, from {low:g} to {high:g}" + (", or inf" if infinite else ""))


def at_most(n: int) -> Rule:
    """A string or a list of at most ``n`` items (characters); a string without a NUL."""
    def test(value: Any) -> bool:
        return len(value) <= n and not (isinstance(value, str) and "\x00" in value)

    return Rule(test=test, says=f"at most {n} long, no NUL character")


def one_of(words: tuple[str, ...]) -> Rule:
    return Rule(test=lambda value: value in words, says=f"one of {', '.join(words)}")


def _sample(value: Any) -> bool:
    t = value.get("t")
    return not isinstance(t, bool) and isinstance(t, (int, float)) and math.isfinite(t)


SAMPLE = Rule(test=_sample, says="with its time t, a finite number")

INT32 = 2**31 - 1
INT64 = 2**63 - 1
# A list of ids or change numbers in one call: what a feed asks for again at most
# (store/feed.py MAX_MISSING), and more than a search fetches graphs for at once.
MAX_IDS = 10_000
# Samples in one call: a node's five minutes are ten; what a long outage kept goes in calls
# of this many (measure/monitor.py SampleCopier), within a request's size (about 3 KB each).
MAX_SAMPLES = 2_000
# A node's devices.
MAX_DEVICES = 1024

Time = Annotated[float, within(-1e12, 1e12)]  # seconds since 1970, or a simulated clock's
Until = Annotated[float, within(-1e12, 1e12, infinite=True)]
Seconds = Annotated[float, within(0.0, 1e12)]  # a duration or a lease
Accuracy = Annotated[float, within(0.0, 1.0)]
Id = Annotated[int, within(0, INT32)]  # a row's id, an index, a round, a pid
Number = Annotated[int, within(0, INT64)]  # a change number, a count
Status = Annotated[str, one_of(tuple(s.value for s in TrialStatus))]
Name = Annotated[str, at_most(200)]  # a run's name
Host = Annotated[str, at_most(255)]  # a host or node name
Hash = Annotated[str, at_most(64)]
Text = Annotated[str, at_most(1 << 24)]  # a reason, a path, a graph: only NUL refused
Ids = Annotated[Sequence[Number], at_most(MAX_IDS)]
Devices = Annotated[list[Host], at_most(MAX_DEVICES)]
Samples = Annotated[list[Annotated[dict[str, Any], SAMPLE]], at_most(MAX_SAMPLES)]
