"""Whether a run's nodes were its own while it ran: the share of CPU time their host stole
(a virtual machine's ``/proc/stat`` steal), the share of GPU readings whose clocks NVML said
were held down by heat, a hardware slowdown or a power brake, and the ceiling measured at
the run's start against the one measured at its end. A run beyond any of the stated limits
is named not comparable: its score says as much about its neighbours as about its machine.

On a 2-core Intel Xeon VM, six runs of the same code reached 0.24-0.56 of their ceilings
where an AMD EPYC VM reached 0.61-0.63; in the worst, one architecture trained at 43-47 GOPS
against 108-118 in the others, its CPU utilisation down to 0.83: the host took the cores.

Pure: plain numbers in, plain data out.
"""

from __future__ import annotations

from typing import Any

# The stated limits: CPU time stolen by the host, GPU readings held down, and how far the
# end's ceiling may lie from the start's (an idle VM's ceiling moves over minutes: bench/
# RESULTS.md, "a ceiling that other processes do not lower").
STEAL_LIMIT = 0.05
THROTTLE_LIMIT = 0.05
CEILING_MOVE_LIMIT = 0.15


def judge(used: dict[str, Any], ceiling_start: float | None,
          ceiling_end: float | None) -> dict[str, Any]:
    """The interference figures of a run (``used``: ``SampleDigest.interference()``) and the
    ceilings at its start and end, with whether it is comparable and why: True within every
    limit, False beyond one, None where nothing was measured."""
    steal, throttled = used.get("cpu_steal"), used.get("gpu_throttled")
    moved = (ceiling_end / ceiling_start if ceiling_start and ceiling_end else None)
    beyond = []
    if steal is not None and steal > STEAL_LIMIT:
        beyond.append(f"the host stole {steal:.1%} of the nodes' CPU time (limit {STEAL_LIMIT:.0%})")
    if throttled is not None and throttled > THROTTLE_LIMIT:
        beyond.append(f"{throttled:.1%} of GPU readings had their clocks held down by heat, a "
                      f"hardware slowdown or a power brake (limit {THROTTLE_LIMIT:.0%})")
    if moved is not None and abs(moved - 1) > CEILING_MOVE_LIMIT:
        beyond.append(f"the ceiling measured at the end is {moved:.2f} of the start's "
                      f"(limit {CEILING_MOVE_LIMIT:.0%} either way)")
    measured = steal is not None or throttled is not None or moved is not None
    comparable = None if not measured else not beyond
    if beyond:
        why = "not comparable: " + "; ".join(beyond)
    elif measured:
        why = "comparable: " + ", ".join(
            part for part in (
                None if steal is None else f"CPU steal {steal:.1%}",
                None if throttled is None else f"GPU clocks held down {throttled:.1%}",
                None if moved is None else f"ceiling at the end {moved:.2f} of the start's")
            if part)
    else:
        why = "unknown: no steal, clock or second ceiling was measured"
    return {"cpu_steal_share": steal, "gpu_throttled_share": throttled,
            "steal_samples": used.get("steal_samples", 0), "gpu_readings": used.get("gpu_readings", 0),
            "ceiling_start_ops": ceiling_start, "ceiling_end_ops": ceiling_end,
            "ceiling_end_over_start": moved,
            "limits": {"cpu_steal": STEAL_LIMIT, "gpu_throttled": THROTTLE_LIMIT,
                       "ceiling_move": CEILING_MOVE_LIMIT},
            "comparable": comparable, "why": why}
