"""The rank's own loader, measured alone and beside training, as a run's rank would run it.

:func:`probe_in_rank_process` starts a process set up as a training rank is
(train/rank.py: its environment, intra-op threads, device and host allocator), loads the
dataset with the run's own data section (:class:`~automlperf.config.DataConfig`: the same
transform, workers and budget), and calls :func:`probe_loader`:

* **alone**: training passes (the first starts the workers and warms the page cache; the
  last is reported) and a validation pass, delivered on the device as the trainer receives
  them (normalised, channels-last), each ended by a device synchronisation: images per
  second, the workers' own decoding rate while decoding, their ratio, and the spread of the
  workers' rates;
* **beside training**: ``train_steps`` steps of ``graph`` (a trial spec's graph: the seed
  model a run starts from) through the trainer's own epoch loop, which books its time as a
  run's epochs do, after ``WARM_STEPS`` untimed steps (kernels set up, the loader running):
  images per second, ``data_share`` (waiting for data) and ``device_share`` (the device's
  side), the two figures each epoch of a run records, summed over the timed steps as a
  run's time breakdown sums its epochs. Where one training pass holds fewer steps than
  that, the probe goes on as a run's epochs follow one another: a validation pass, then
  the next epoch's training pass (its own shuffle and crops), which the loader has been
  decoding ahead; it then times whole passes (the share of a pass's first steps differs
  from its last ones'), which costs at most one pass more, a pass being short there.
  Also the host cores the rank and its workers kept busy over the timed steps
  (``busy_cores``: their CPU seconds over the wall's, from the end of the warm-up on), and
  the probe's own ``spread``: its rate over the first half of the timed steps
  against the second's, from the progress reports a run's rank 0 makes (twice a second),
  where there are four intervals at least.

Everything returned is plain JSON data.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from automlperf.config import DataConfig

_ALONE_PASSES = 3
WARM_STEPS = 2  # training steps before the probe's clocks start


def _loader_figures(loader: Any, before: dict[str, Any] | None) -> dict[str, Any]:
    """The loader's worker figures since ``before`` (a summary taken earlier), or None where
    the dataset has no such loader (in-memory data, DALI)."""
    stats = getattr(loader, "stats", None)
    if stats is None:
        return {}
    now = stats.summary()
    if before is None:
        return now
    rates = []
    for n1, s1, n0, s0 in zip(now["worker_images"], now["worker_busy_s"],
                              before["worker_images"], before["worker_busy_s"]):
        if s1 - s0 > 0:
            rates.append((n1 - n0) / (s1 - s0))
    return {"decode_images_per_s": sum(rates),
            "worker_rate_spread": min(rates) / max(rates) if rates else None,
            "loader_data_wait_s": now["data_wait_s"] - before["data_wait_s"],
            "loader_device_wait_s": now["device_wait_s"] - before["device_wait_s"]}


def _timed_pass(dataset: Any, split: str, epoch: int, per_rank: int, device: Any,
                then: tuple[str, int] | None) -> dict[str, Any]:
    from automlperf.train.device import synchronize

    loader = dataset.loader(0, 1, per_rank, 0, device) if hasattr(dataset, "loader") else None
    before = _loader_figures(loader, None) if loader is not None else None
    dataset.expect_next(then)
    began, images = time.perf_counter(), 0
    for _, y in dataset.batches(split, 0, 1, per_rank, epoch, 0, device):
        images += len(y)
    synchronize(device)
    seconds = time.perf_counter() - began
    out = {"images": images, "seconds": seconds, "images_per_s": images / max(seconds, 1e-9)}
    if loader is not None:
        out.update(_loader_figures(loader, before))
        if out.get("decode_images_per_s"):
            out["delivered_over_decoded"] = out["images_per_s"] / out["decode_images_per_s"]
    return out


def beside_training(run: Any, train_steps: int) -> dict[str, Any]:
    """``train_steps`` timed steps of ``run`` (a trainer's ``_Run``) after ``WARM_STEPS``
    untimed ones, epoch after epoch with a validation pass between them where one pass holds
    fewer steps than that (see the module's description): the run's per-epoch figures summed
    over the timed steps, the busy host cores and the probe's own spread."""
    per_pass = run.steps_per_epoch
    spans = per_pass < WARM_STEPS + train_steps
    warm, left = WARM_STEPS, train_steps
    steps = images = passes = 0
    seconds = data_wait = device_wait = 0.0
    marks: list[tuple[int, float, int]] = []  # (pass, time, step) of each timed report
    busy = _BusyCores()
    untimed = warm

    def noted(kind: str, payload: dict[str, Any]) -> None:
        if kind == "timed" or (kind == "progress" and payload["step"] > untimed):
            busy.start()
            marks.append((passes, time.perf_counter(), int(payload["step"])))

    # Each pass takes one step at least; a pass of unreadable files only could take none.
    for epoch in range(WARM_STEPS + train_steps):
        if epoch:
            run.validate()  # as a run's epoch ends: the loader decodes the next pass meanwhile
        passes += 1
        # The first steps set the network's kernels up (and compile it): untimed, so that
        # the timed steps find the loader as a run's epochs do, running.
        if warm >= per_pass:  # the whole pass warms up
            warm -= max(1, run.train_epoch(epoch, _quiet).steps)
            continue
        untimed = warm
        times = run.train_epoch(epoch, noted, max_steps=None if spans else warm + left,
                                untimed_steps=warm)
        warm = 0
        steps, images = steps + times.steps, images + times.images
        seconds += times.seconds
        data_wait, device_wait = data_wait + times.data_wait, device_wait + times.device_wait
        left -= times.steps
        if left <= 0:
            break
    seconds = max(seconds, 1e-9)
    return {"steps": steps, "images": images, "seconds": seconds, "passes": passes,
            "images_per_s": images / seconds, "data_share": min(1.0, data_wait / seconds),
            "device_share": min(1.0, device_wait / seconds), "busy_cores": busy.stop(),
            "spread": halves_spread(marks)}


def halves_spread(marks: list[tuple[int, float, int]]) -> float | None:
    """The difference between the step rate over the first and the second half of the timed
    intervals between progress reports (``(pass, time, step)``; intervals within a pass),
    over their mean; None with fewer than four intervals."""
    intervals = [(t1 - t0, s1 - s0) for (p0, t0, s0), (p1, t1, s1) in zip(marks, marks[1:])
                 if p0 == p1 and t1 > t0 and s1 > s0]
    if len(intervals) < 4:
        return None
    half = len(intervals) // 2
    rates = [sum(s for _, s in part) / sum(t for t, _ in part)
             for part in (intervals[:half], intervals[half:])]
    return abs(rates[0] - rates[1]) / (sum(rates) / 2)


class _BusyCores:
    """The host cores this process and its children (the decoding workers) keep busy
    between :meth:`start` (the first call counts) and :meth:`stop`: CPU seconds over wall
    seconds (psutil)."""

    def __init__(self) -> None:
        self.began: tuple[float, float] | None = None

    @staticmethod
    def _cpu() -> float:
        import psutil

        me = psutil.Process()
        total = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:  # ended meanwhile
                continue
            total += t.user + t.system
        return total

    def start(self) -> None:
        if self.began is None:
            self.began = (time.perf_counter(), self._cpu())

    def stop(self) -> float | None:
        if self.began is None:
            return None
        wall = time.perf_counter() - self.began[0]
        return (self._cpu() - self.began[1]) / wall if wall > 0 else None


def _quiet(kind: str, payload: dict[str, Any]) -> None:
    return None


def probe_loader(dataset: Any, device: Any, per_rank: int, graph: dict[str, Any] | None = None,
                 train_steps: int = 100, precision: str = "auto",
                 channels_last: bool | None = None, compile: bool = False) -> dict[str, Any]:
    """The loader of ``dataset`` (a loaded :class:`~automlperf.train.data.Dataset`) at
    ``per_rank`` images per step on ``device`` (a torch device), alone and, with ``graph``,
    beside ``train_steps`` training steps in ``precision`` (see the module's description).
    Call it in a process set up as a rank (:func:`probe_in_rank_process`)."""
    from automlperf.graph.graph import Graph
    from automlperf.train.spec import TrialSpec
    from automlperf.train.trainer import RankContext, _Run

    out: dict[str, Any] = {"per_rank": per_rank, "device": str(device)}
    plan = getattr(getattr(dataset, "_loader", None), "plan", None)
    try:
        alone = [_timed_pass(dataset, "train", e, per_rank, device, ("train", e + 1))
                 for e in range(_ALONE_PASSES - 1)]
        alone.append(_timed_pass(dataset, "train", _ALONE_PASSES - 1, per_rank, device,
                                 ("val", 0)))
        out["alone"] = alone[-1]
        out["validation"] = _timed_pass(dataset, "val", 0, per_rank, device, None)
        plan = getattr(getattr(dataset, "_loader", None), "plan", None)
        if graph is not None:
            spec = TrialSpec("probe", graph, epochs=1, batch_size=per_rank, patience=1,
                             precision=precision, channels_last=channels_last, compile=compile)
            run = _Run(spec, RankContext(0, 1, device, dataset), Graph.from_dict(graph))
            loader = getattr(dataset, "_loader", None)
            before = _loader_figures(loader, None) if loader is not None else None
            out["training"] = {**beside_training(run, train_steps),
                               **(_loader_figures(loader, before) if loader is not None else {})}
    finally:
        dataset.release()
    if plan is not None:
        out["loader"] = {"slots": plan.slots, "chunk": plan.chunk,
                         "shared_bytes": plan.shared_bytes, "pinned_bytes": plan.pinned_bytes}
    return out


def _rank_process(conn: Connection, data: DataConfig, index_dir: str | None, device_name: str,
                  threads: int, kwargs: dict[str, Any]) -> None:
    """A probe in a process set up as train/rank.py sets up a rank."""
    from automlperf.train.rankenv import (configured_compile_threads, decoding_on_gpu,
                                           set_rank_environment, take_device)

    chosen = set_rank_environment(threads, data.workers or 0)
    try:
        import torch

        from automlperf.train import data as datasets

        device = torch.device(device_name)
        take_device(device, threads)
        dataset = datasets.load(data, index_dir, device.type)
        if getattr(dataset, "decodes_on_gpu", False):
            decoding_on_gpu(threads, chosen)
        result = probe_loader(dataset, device, **kwargs)
        result["compile_threads"] = configured_compile_threads(1)
        result["rank_threads"] = torch.get_num_threads()
        result["workers"] = data.workers or 0
        result["decode_path"] = dataset.decode_path
        conn.send_bytes(json.dumps({"ok": result}).encode())
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        conn.send_bytes(json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc()}).encode())


class ProbeError(RuntimeError):
    """The probe could not run; the message says why."""


def probe_in_rank_process(data: DataConfig, device: str, threads: int, per_rank: int,
                          graph: dict[str, Any] | None = None, train_steps: int = 100,
                          precision: str = "auto", channels_last: bool | None = None,
                          compile: bool = False, timeout_s: float = 1800.0,
                          index_dir: str | None = None) -> dict[str, Any]:
    """:func:`probe_loader` in a new process set up as a rank with ``threads`` cores on
    ``device`` (``"cpu"``, ``"cuda:0"``), loading the data section ``data`` as the run's
    ranks do (an image folder needs its ``data_dir``; ``index_dir``: its scanned index).
    Raises :class:`ProbeError` when it fails or outlasts ``timeout_s``."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    kwargs = {"per_rank": per_rank, "graph": graph, "train_steps": train_steps,
              "precision": precision, "channels_last": channels_last, "compile": compile}
    proc = ctx.Process(target=_rank_process, name="automlperf-loader-probe",
                       args=(child, data.for_ranks(threads), index_dir, device, threads,
                             kwargs))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise ProbeError(f"the loader probe did not finish in {timeout_s:.0f} s")
        try:
            answer = json.loads(parent.recv_bytes())
        except EOFError:
            proc.join(30)
            raise ProbeError(f"the loader probe exited with code {proc.exitcode}") from None
    finally:
        if proc.is_alive():
            proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(30)
    if "error" in answer:
        raise ProbeError(answer["error"])
    return dict(answer["ok"])
