"""The code of a replica's training processes: each initialises its device, the process group
and the dataset once, then trains the trial specs its parent sends (JSON over a pipe) until
told to stop. Ranks ignore Ctrl-C and SIGTERM: the parent (train/pool.py) alone decides when
they stop."""

from __future__ import annotations

import gc
import json
import signal
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from automlperf import hardware
from automlperf.config import DataConfig
from automlperf.procutil import die_with_parent
from automlperf.train.binding import bind_rank
from automlperf.train.oomkill import volunteer_for_oom_kill
from automlperf.train.rankenv import decoding_on_gpu, set_rank_environment, take_device
from automlperf.train.spec import TrialSpec


def process_group_backend(device_type: str) -> str:
    """The collective library of a device type: NCCL (or RCCL on ROCm) for ``cuda``, XCCL,
    HCCL for the plugins that register one, Gloo on the CPU."""
    import torch.distributed as dist

    if device_type == "cpu":
        return "gloo"
    if device_type == "cuda":
        return "nccl"
    lookup = getattr(dist, "get_default_backend_for_device", None)
    if lookup is not None:
        try:
            return str(lookup(device_type))
        except (RuntimeError, ValueError):
            pass
    return "gloo"


def send(conn: Connection, kind: str, payload: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps({"kind": kind, **payload}).encode())


def rank_main(rank: int, world: int, rendezvous: str, device_name: str, threads: int,
              data: DataConfig, index_dir: str | None, conn: Connection, parent_pid: int,
              measure: Callable[[], dict[str, Any]] | None = None, cpu_binding: str = "auto",
              measure_first: bool = True) -> None:
    """A training process: its device and its place on the node's cores (``cpu_binding``:
    train/binding.py), ``measure`` (a CPU node's measurement, asked of rank 0: before the
    others join it at the pool's first start, ``measure_first``, reported as ``node``; and
    between trials when the parent asks), its share of the process group and the dataset of
    ``data`` (its image folder's index in ``index_dir``, if scanned), then trials from the
    parent until it says stop."""
    die_with_parent(parent_pid)
    volunteer_for_oom_kill()
    # Ranks stop when the parent says so or kills them; Ctrl-C and SIGTERM go to the parent
    # (a batch system signals every process of the step). Their data-loading workers inherit
    # this, so a signal does not tear the pipeline down under a trial the parent is about to
    # stop in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Before PyTorch reads them: the caching allocator's segments, Inductor's compile workers.
    chosen = set_rank_environment(threads, data.workers or 0)
    try:
        import torch
        import torch.distributed as dist

        from automlperf.train import data as datasets
        from automlperf.train.trainer import RankContext, train_on_rank

        device = torch.device(device_name)
        take_device(device, threads)
        # A CPU node's measurement first, on every core it may use; then this rank's place,
        # before the process group and the decoding workers it forks.
        node = measure() if measure is not None and measure_first else None
        bound = bind_rank(device, cpu_binding, rank, world)
        if world > 1:
            dist.init_process_group(process_group_backend(device.type),
                                    init_method=rendezvous, rank=rank,
                                    world_size=world, timeout=timedelta(seconds=600))
            # A first collective, so that backends which connect lazily (NCCL) use the
            # rendezvous file now: the parent removes it once every rank is ready.
            dist.all_reduce(torch.zeros(1, device=device))
        dataset = datasets.load(data, index_dir, device.type)
        if getattr(dataset, "decodes_on_gpu", False):
            decoding_on_gpu(threads, chosen)
        ctx = RankContext(rank, world, device, dataset, distributed=world > 1)
        send(conn, "ready", {"rank": rank, "dataset": dataset.describe(),
                             "device": hardware.device_name(torch, device),
                             "uuid": hardware.device_uuid(torch, device),
                             "binding": bound.to_dict(),
                             **({} if node is None else {"node": node})})
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        send(conn, "fatal", {"rank": rank, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()})
        return
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            return  # the parent is gone
        if msg["kind"] == "stop":
            break
        if msg["kind"] == "measure":
            send(conn, "measured", {"node": None if measure is None else measure()})
            continue
        spec = TrialSpec.from_dict(msg["spec"])
        outcome = train_on_rank(spec, ctx, emit=lambda kind, payload: send(conn, kind, payload))
        if gc.get_freeze_count() == 0:
            # What survives the first trial's collection (torch and its compiler's modules,
            # this rank's own state) lives as long as this process: left out of every later
            # collection (bench/RESULTS.md, "What the code's comments rest on").
            gc.freeze()
        send(conn, "done", {"rank": rank, "outcome": outcome.to_dict()})
    if world > 1:
        dist.destroy_process_group()
