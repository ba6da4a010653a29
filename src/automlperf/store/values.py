"""Values as the store keeps them: a sample's numbers packed as float64, and long runs' rows
built without the cycle collector walking them."""

from __future__ import annotations

import contextlib
import gc
import sys
from array import array
from collections.abc import Iterator
from typing import Any

_EXACT = 2**53  # integers up to this come back from a float64 unchanged


def packed(numbers: list[Any]) -> bytes | None:
    """The numbers as little-endian float64, or None where one would not come back as it
    was (not a number, or an integer too large)."""
    for v in numbers:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, int)
                                                                      and abs(v) > _EXACT):
            return None
    out = array("d", numbers)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def unpacked(data: bytes) -> list[float]:
    numbers = array("d", bytes(data))
    if sys.byteorder == "big":
        numbers.byteswap()
    return numbers.tolist()


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """Building a long run's rows (a million samples, half a million epochs): Python's cycle
    collector would walk every one of them again and again as they accumulate, and they hold
    no cycles, so it waits until they are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
