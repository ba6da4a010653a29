"""Where each replica's run time went (pure: plain data in, plain data out).

For every replica and session, the session's run time is split without overlap or gap:

* ``start_to_first_epoch_s``: from the clock's start to the start of the replica's first
  counted epoch (launch, node measurement, process start, first candidate);
* ``training_s`` and ``validation_s``: inside counted epochs. Of the training, two parts
  (not in the sum): ``data_wait_s``, waiting for the next batch's data, and
  ``device_wait_s``, the device's side (running or launching the steps, waiting for the
  device); None where no epoch measured the latter (recorded before it was);
* ``candidate_wait_s``: after the first epoch, waiting for the search to hand over a candidate;
* ``between_trials_s``: the rest of the time between counted epochs (building and inheriting
  the next model, saving weights, recording);
* ``lost_at_deadline_s``: after the last counted epoch (epochs in flight at the deadline).

Under a ruleset that charges each replica its own time (``grace_s`` > 0), an epoch in flight
at a session's deadline that finished inside the grace counts, and its replica's session
ends with it.

Utilisation is the mean of the monitor's samples taken inside the sessions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from automlperf.measure.score import SegmentLike, segment_bounds

PARTS = ("start_to_first_epoch_s", "training_s", "validation_s", "data_wait_s",
         "device_wait_s", "candidate_wait_s", "between_trials_s", "lost_at_deadline_s")
# Parts of training_s: the others split the run time without overlap or gap.
OF_TRAINING = ("data_wait_s", "device_wait_s")
# Parts a result.json written before them does not have.
ADDED_PARTS = ("device_wait_s",)


class TimedEpoch(Protocol):
    trial_id: int
    started_at: float
    ended_at: float
    train_images: int
    images_per_s: float
    data_share: float
    device_share: float | None


class TrialTimes(Protocol):
    id: int
    replica_index: int
    created_at: float
    hparams: dict[str, Any]


def _split(epochs: Sequence[TimedEpoch], waits: Sequence[tuple[float, float]], start: float,
           end: float) -> dict[str, float]:
    """One replica's session [start, end] from its counted epochs (by start time) and its
    candidate waits as (claimed at, seconds waited)."""
    out: dict[str, Any] = dict.fromkeys(PARTS, 0.0)
    out["device_wait_s"] = None
    out["session_s"] = end - start
    if not epochs:
        out["start_to_first_epoch_s"] = end - start
        return out
    first, last = epochs[0].started_at, epochs[-1].ended_at
    out["start_to_first_epoch_s"] = max(0.0, first - start)
    out["lost_at_deadline_s"] = max(0.0, end - last)
    inside = 0.0
    for e in epochs:
        seconds = max(0.0, e.ended_at - e.started_at)
        train = min(seconds, e.train_images / e.images_per_s if e.images_per_s > 0 else seconds)
        out["training_s"] += train
        out["validation_s"] += seconds - train
        out["data_wait_s"] += train * min(1.0, max(0.0, e.data_share))
        if e.device_share is not None:
            out["device_wait_s"] = (out["device_wait_s"] or 0.0) + \
                train * min(1.0, max(0.0, e.device_share))
        inside += seconds
    gaps = max(0.0, (last - first) - inside)
    waited = sum(s for at, s in waits if first < at <= last)
    out["candidate_wait_s"] = min(gaps, waited)
    out["between_trials_s"] = gaps - out["candidate_wait_s"]
    return out


def breakdown(epochs: Iterable[TimedEpoch], trials: Iterable[TrialTimes],
              segments: Sequence[SegmentLike],
              samples: Iterable[Mapping[str, Any]] = (),
              used: dict[str, Any] | None = None, grace_s: float = 0.0) -> dict[str, Any]:
    """Per replica and in total: the time parts above, in seconds and as shares of the
    replicas' run time; and the mean accelerator and CPU utilisation (``used``, when the
    caller has it from :class:`~automlperf.measure.samples.SampleDigest`, else from
    ``samples``)."""
    replica_of = {t.id: t.replica_index for t in trials}
    waits: dict[int, list[tuple[float, float]]] = {}
    for t in trials:
        waited = t.hparams.get("candidate_wait_s")
        if waited:
            waits.setdefault(t.replica_index, []).append((t.created_at, float(waited)))
    bounds = segment_bounds(segments)
    per: dict[int, dict[str, float]] = {}
    by_replica: dict[int, list[TimedEpoch]] = {}
    for e in epochs:
        if e.trial_id in replica_of:
            by_replica.setdefault(replica_of[e.trial_id], []).append(e)
    for replica in sorted(by_replica.keys() | waits.keys()):
        mine = sorted(by_replica.get(replica, []), key=lambda e: (e.started_at, e.ended_at))
        total: dict[str, Any] = dict.fromkeys((*PARTS, "session_s"), 0.0)
        total["device_wait_s"] = None
        for seg, (start, end, _) in zip(segments, bounds):
            # Epochs in flight at a reached deadline count if they ended inside the grace.
            late = end + grace_s if grace_s > 0 and end >= seg.deadline_at else end
            inside = [e for e in mine if start <= e.started_at and e.ended_at <= end
                      or start <= e.started_at < end < e.ended_at <= late]
            mine_end = max([end] + [e.ended_at for e in inside])
            part = _split(inside, waits.get(replica, []), start, mine_end)
            _add(total, part)
        per[replica] = total
    overall: dict[str, Any] = dict.fromkeys((*PARTS, "session_s"), 0.0)
    overall["device_wait_s"] = None
    for part in per.values():
        _add(overall, part)
    return {"replicas": [{"replica": r, **_rounded(p)} for r, p in per.items()],
            "total": _rounded(overall),
            "shares": {k: (overall[k] / overall["session_s"]
                           if overall["session_s"] and overall[k] is not None else None)
                       for k in PARTS},
            "utilisation": used if used is not None else utilisation(samples, bounds)}


def _add(total: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Add ``part``'s seconds to ``total``'s; a part measured nowhere stays None."""
    for key, value in part.items():
        if value is not None:
            total[key] = (total[key] or 0.0) + value


def _rounded(part: Mapping[str, Any]) -> dict[str, Any]:
    return {k: None if v is None else round(v, 6) for k, v in part.items()}


def utilisation(samples: Iterable[Mapping[str, Any]],
                bounds: Sequence[tuple[float, float, float]]) -> dict[str, Any]:
    """Mean accelerator and CPU utilisation (0..1) over the samples inside the sessions."""
    gpu: list[float] = []
    cpu: list[float] = []
    count = 0
    for s in samples:
        t = s.get("t")
        if t is None or not any(a <= t <= b for a, b, _ in bounds):
            continue
        count += 1
        if s.get("cpu_percent") is not None:
            cpu.append(float(s["cpu_percent"]) / 100.0)
        gpu.extend(float(g["util"]) / 100.0 for g in s.get("gpus", []) if "util" in g)
    return {"accelerator": sum(gpu) / len(gpu) if gpu else None,
            "cpu": sum(cpu) / len(cpu) if cpu else None, "samples": count}
