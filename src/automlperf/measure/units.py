"""Operations per second for people: one scale for a number, or for an axis of them."""

from __future__ import annotations

import math
from collections.abc import Iterable

_SCALES = ((1e18, "EOPS"), (1e15, "POPS"), (1e12, "TOPS"), (1e9, "GOPS"), (1e6, "MOPS"),
           (1e3, "kOPS"))


def ops_unit(values: Iterable[float | None]) -> tuple[float, str]:
    """The scale and unit that suit the largest of ``values``."""
    peak = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    return next(((scale, unit) for scale, unit in _SCALES if peak >= scale), (1.0, "OPS"))


def format_ops(value: float | None) -> str:
    """E.g. ``18.2 GOPS``; ``-`` when there is no value."""
    if value is None or not math.isfinite(value):
        return "-"
    scale, unit = ops_unit([value])
    return f"{value / scale:.3g} {unit}"


def format_energy(joules: float | None) -> str:
    """E.g. ``3.6 MJ (1 kWh)``; ``-`` when nothing was measured."""
    if not isinstance(joules, (int, float)) or not math.isfinite(joules):
        return "-"
    for scale, unit in ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ"), (1.0, "J")):
        if abs(joules) >= scale or unit == "J":
            return f"{joules / scale:.3g} {unit} ({joules / 3.6e6:.3g} kWh)"
    return "-"
