"""Resource monitor: one sampler process per node, every ``interval_s`` seconds.

Records per-GPU utilisation, memory, power and the cumulative energy counter through NVML
(``nvidia-ml-py``, imported only here), with the SM clock and the reasons NVML gives for
holding it down (``throttled`` where they are interference: thermal or hardware slowdown, a
power brake), CPU utilisation and host memory through psutil, the share of CPU time the
host stole from this (virtual) machine since the last sample (``cpu_steal``, from
``/proc/stat``), and the CPU packages' RAPL energy counters where readable, into the run's
store and ``monitor/<node>.jsonl``. Energy is the difference of the counters between samples
(measure/energy.py). NVML numbers devices its own way and ignores
CUDA_VISIBLE_DEVICES, so GPUs are matched to torch's numbering by UUID. Without a GPU (or
without NVML) it records CPU and memory only.

AMD GPUs are sampled through amdsmi instead where it is installed and NVML finds no GPU.

Run as: python -m automlperf.measure.monitor --run-dir D --interval 30 [--uuids a,b]
[--to-stdout]. A replica starts it with ``--to-stdout`` and stores what it prints
(:class:`SampleCopier`), so the sampler holds no connection to the store of its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from automlperf.measure.energy import POWERCAP, RaplReader

log = logging.getLogger("automlperf.monitor")


# NVML's clock event reasons (nvmlClocksEventReason*, formerly ClocksThrottleReason*) that
# mean something outside the run held the GPU's clock down: hardware slowdown, software and
# hardware thermal slowdown, the power brake. Idle, application clocks, a display clock and
# the software power cap (the GPU at its power limit, as full load brings it) are not counted.
INTERFERENCE_REASONS = 0x8 | 0x20 | 0x40 | 0x80


def clock_figures(nv: Any, handle: Any) -> dict[str, Any]:
    """The SM clock, its maximum and NVML's reasons for holding it down, where NVML gives
    them (older bindings name the reasons' call ``ClocksThrottleReasons``)."""
    out: dict[str, Any] = {}
    try:
        sm = getattr(nv, "NVML_CLOCK_SM", 1)
        out["sm_clock_mhz"] = int(nv.nvmlDeviceGetClockInfo(handle, sm))
        out["sm_clock_max_mhz"] = int(nv.nvmlDeviceGetMaxClockInfo(handle, sm))
    except (nv.NVMLError, AttributeError):
        pass
    reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    if reasons is not None:
        try:
            mask = int(reasons(handle))
            out["clock_reasons"] = mask
            out["throttled"] = bool(mask & INTERFERENCE_REASONS)
        except nv.NVMLError:
            pass
    return out


class StealReader:
    """The share of this machine's CPU time that its host took for others since the last
    reading: ``/proc/stat``'s steal over all its counters (Linux in a virtual machine; None
    where the file or the field is absent)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self.last = self._counters()

    def _counters(self) -> tuple[int, int] | None:
        try:
            with open(self.path, encoding="ascii") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 9 or fields[0] != "cpu":
            return None
        values = [int(v) for v in fields[1:9]]  # user .. steal; guests are inside user
        return values[7], sum(values)

    def read(self) -> float | None:
        now = self._counters()
        last, self.last = self.last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return max(0.0, (now[0] - last[0]) / (now[1] - last[1]))


class GPUSampler:
    """NVML handles for the given UUIDs (torch order), then with ``every_gpu`` every other
    GPU of the node that NVML can open (several replicas share the node); empty if NVML is
    unavailable. A device NVML refuses (NO_PERMISSION on a shared node) is left out and
    noted, never fatal."""

    def __init__(self, uuids: list[str] | None = None, every_gpu: bool = False) -> None:
        self.handles: list[tuple[int, str, Any]] = []
        self.error: str | None = None
        self.refused: list[str] = []
        try:
            import pynvml
        except ImportError:
            self.error = "nvidia-ml-py is not installed"
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.error = f"NVML unavailable: {exc}"
            return
        by_uuid = {}
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.error = f"NVML cannot count the GPUs: {exc}"
            return
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                by_uuid[_text(pynvml.nvmlDeviceGetUUID(handle))] = handle
            except pynvml.NVMLError as exc:
                self.refused.append(f"NVML device {i}: {exc}")
        order = list(uuids or [])
        if every_gpu or not order:
            order += sorted(u for u in by_uuid if u not in order)
        for index, uuid in enumerate(order):
            if uuid in by_uuid:
                self.handles.append((index, uuid, by_uuid[uuid]))
        if self.refused and not self.error:
            self.error = "; ".join(self.refused)

    def sample(self) -> list[dict[str, Any]]:
        out = []
        for index, uuid, handle in self.handles:
            nv = self.nvml
            entry: dict[str, Any] = {"index": index, "uuid": uuid}
            try:
                util = nv.nvmlDeviceGetUtilizationRates(handle)
                mem = nv.nvmlDeviceGetMemoryInfo(handle)
                entry.update(util=float(util.gpu), mem_used_gib=mem.used / 2**30,
                             mem_total_gib=mem.total / 2**30)
                entry["power_w"] = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except nv.NVMLError as exc:
                entry["error"] = str(exc)
            try:
                # Millijoules since the driver loaded (Volta and newer).
                entry["energy_mj"] = int(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
            except nv.NVMLError:
                pass
            entry.update(clock_figures(nv, handle))
            out.append(entry)
        return out


class AmdSampler:
    """The same records for AMD GPUs through amdsmi (the ``amd`` extra, imported only
    here): activity, VRAM, socket power and the energy accumulator."""

    def __init__(self, uuids: list[str] | None = None) -> None:
        self.handles: list[tuple[int, str, Any]] = []
        self.error: str | None = None
        try:
            import amdsmi
        except ImportError:
            self.error = "amdsmi is not installed"
            return
        self.smi = amdsmi
        try:
            amdsmi.amdsmi_init()
            found = [(_text(amdsmi.amdsmi_get_gpu_device_uuid(h)), h)
                     for h in amdsmi.amdsmi_get_processor_handles()]
        except Exception as exc:  # noqa: BLE001 - amdsmi raises its own exception types
            self.error = f"amdsmi unavailable: {exc}"
            return
        by_uuid = {_bare(u): (u, h) for u, h in found}
        wanted = [by_uuid[_bare(u)] for u in uuids or [] if _bare(u) in by_uuid]
        # torch's and amdsmi's UUID spellings may differ: then every GPU, in amdsmi's order.
        for index, (uuid, handle) in enumerate(wanted or found):
            self.handles.append((index, uuid, handle))

    def sample(self) -> list[dict[str, Any]]:
        out = []
        smi = self.smi
        for index, uuid, handle in self.handles:
            entry: dict[str, Any] = {"index": index, "uuid": uuid}
            try:
                vram = smi.amdsmi_get_gpu_vram_usage(handle)  # MB
                power = smi.amdsmi_get_power_info(handle)  # W
                entry.update(util=float(smi.amdsmi_get_gpu_activity(handle)["gfx_activity"]),
                             mem_used_gib=vram["vram_used"] / 1024,
                             mem_total_gib=vram["vram_total"] / 1024,
                             power_w=float(power.get("current_socket_power")
                                           or power.get("average_socket_power") or 0.0))
            except Exception as exc:  # noqa: BLE001
                entry["error"] = str(exc)
            try:
                count = smi.amdsmi_get_energy_count(handle)
                accumulated = count.get("energy_accumulator", count.get("power"))
                # The accumulator counts in units of counter_resolution microjoules.
                entry["energy_mj"] = int(accumulated * count["counter_resolution"] / 1000)
            except Exception:  # noqa: BLE001 - not every GPU has the counter
                pass
            out.append(entry)
        return out


def open_gpu_sampler(uuids: list[str], every_gpu: bool = False) -> GPUSampler | AmdSampler:
    """NVML's sampler where it finds GPUs, else amdsmi's, else NVML's (which says why)."""
    nvidia = GPUSampler(uuids, every_gpu)
    if nvidia.handles:
        return nvidia
    amd = AmdSampler(uuids)
    return amd if amd.handles else nvidia


class NoGPUs:
    """The sampler of a simulated run: no accelerator of this machine is the run's."""

    handles: list[Any] = []
    error: str | None = None

    def sample(self) -> list[dict[str, Any]]:
        return []


def _bare(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def host_sample(steal: StealReader | None = None) -> dict[str, Any]:
    import psutil

    mem = psutil.virtual_memory()
    out = {"cpu_percent": psutil.cpu_percent(interval=None),
           "mem_used_gib": (mem.total - mem.available) / 2**30, "mem_total_gib": mem.total / 2**30}
    if steal is not None:
        out["cpu_steal"] = steal.read()
    return out


def sample(gpus: GPUSampler | AmdSampler | NoGPUs, rapl: RaplReader | None = None,
           steal: StealReader | None = None) -> dict[str, Any]:
    record = {"t": time.time(), **host_sample(steal), "gpus": gpus.sample()}
    if rapl is not None and rapl.domains:
        record["cpu_energy_uj"] = rapl.read()
    return record


class _Printer:
    """Where a sampler started by a replica sends its samples: its standard output."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def add_samples(self, run_id: int, node: str, samples: list[dict[str, Any]]) -> None:
        for record in samples:
            self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()


def run_sampler(run_dir: Path, store_url: str | None, interval_s: float, uuids: list[str],
                node: str, stop: threading.Event | None = None,
                powercap: Path = POWERCAP, every_gpu: bool = False,
                to: IO[str] | None = None, host_only: bool = False) -> None:
    """Sample until ``stop`` is set (or SIGTERM); each sample goes to the file at once and
    to the store (batched, so a slow store never delays sampling), or with ``to`` to that
    stream instead of the store. ``host_only`` (a simulated run) reads neither the GPUs nor
    the CPU's energy: the run's devices are a model's, and the machine's watts are not theirs."""
    from automlperf.store.rundir import RunDir

    rd = RunDir(run_dir)
    run_id = int(rd.meta()["run_id"])
    if to is not None:
        store: Any = _Printer(to)
    else:
        from automlperf.store import open_store

        store = open_store(rd.store_url(store_url), run_dir=run_dir)
    stop = stop or threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rd.monitor.mkdir(exist_ok=True)
    gpus: GPUSampler | AmdSampler | NoGPUs = NoGPUs() if host_only else open_gpu_sampler(uuids, every_gpu)
    rapl = None if host_only else RaplReader(powercap)
    import psutil

    psutil.cpu_percent(interval=None)  # the first reading only starts the measurement
    steal = StealReader()
    pending: list[dict[str, Any]] = []
    with open(rd.monitor / f"{node}.jsonl", "a", encoding="utf-8") as out:
        for note in (gpus.error, rapl and rapl.error):
            if note:
                out.write(json.dumps({"t": time.time(), "note": note}) + "\n")
        wait = min(interval_s, 2.0)  # an early first sample, so short runs have one
        while True:
            if stop.wait(wait):
                break
            wait = interval_s
            record = sample(gpus, rapl, steal)
            out.write(json.dumps(record) + "\n")
            out.flush()
            pending.append(record)
            try:
                store.add_samples(run_id, node, pending)
                pending = []
            except Exception:  # noqa: BLE001 - kept and sent with the next sample
                pass
        record = sample(gpus, rapl, steal)
        out.write(json.dumps(record) + "\n")
        pending.append(record)
        try:
            store.add_samples(run_id, node, pending)
        except Exception:  # noqa: BLE001 - the file has it
            pass


# How long a replica gathers its node's samples before storing them in one write: ten
# samples at the default interval, so that 10,000 nodes' samples are 33 writes a second, not
# 333. The node's sample file (monitor/<node>.jsonl) has each one at once.
SAMPLE_BATCH_S = 300.0


class SampleCopier:
    """Stores the samples a sampler started with ``--to-stdout`` prints (a thread reads its
    output), ``batch_s`` seconds of them at a time and the last when the sampler stops; what the
    store refuses is kept and sent with the next."""

    def __init__(self, lines: Iterable[str], store: Any, run_id: int, node: str,
                 batch_s: float = SAMPLE_BATCH_S) -> None:
        self.lines = lines
        self.store = store
        self.run_id = run_id
        self.node = node
        self.batch_s = batch_s
        self.stored = 0
        self.thread = threading.Thread(target=self._copy, name="samples", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        pending: list[dict[str, Any]] = []
        failed = 0
        for line in self.lines:
            try:
                sample = json.loads(line)
            except (ValueError, RecursionError):
                continue
            t = sample.get("t") if isinstance(sample, dict) else None
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                continue  # a library's stray output, not a sample
            pending.append(sample)
            if t - pending[0]["t"] < self.batch_s:
                continue
            try:
                self._store(pending)
            except Exception as exc:  # noqa: BLE001 - the file has them; retried with the next
                failed += 1
                if failed == 1:
                    log.warning("samples not stored (%s: %s); kept and sent with the next",
                                type(exc).__name__, exc)
                continue
            failed = 0
        if pending:
            try:
                self._store(pending)
            except Exception as exc:  # noqa: BLE001 - the file has them
                log.warning("the last samples not stored (%s: %s); the node's sample file has "
                            "them", type(exc).__name__, exc)

    def _store(self, pending: list[dict[str, Any]]) -> None:
        """Store ``pending`` in calls of at most MAX_SAMPLES (an outage may have kept many),
        each taken out of it once stored: what a failure leaves stays pending."""
        from automlperf.store.limits import MAX_SAMPLES

        while pending:
            self.store.add_samples(self.run_id, self.node, pending[:MAX_SAMPLES])
            self.stored += len(pending[:MAX_SAMPLES])
            del pending[:MAX_SAMPLES]

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--store", default=None)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--uuids", default="")
    ap.add_argument("--node", default=socket.gethostname())
    ap.add_argument("--every-gpu", action="store_true",
                    help="also sample the node's other GPUs (other replicas' on this node)")
    ap.add_argument("--to-stdout", action="store_true",
                    help="print each sample for the process that stores them, instead of "
                         "opening the store")
    ap.add_argument("--host-only", action="store_true",
                    help="sample the host only, no GPU and no CPU energy (a simulated run)")
    args = ap.parse_args()
    from automlperf.procutil import die_with_parent

    die_with_parent()
    run_sampler(args.run_dir, args.store, args.interval,
                [u for u in args.uuids.split(",") if u], args.node, every_gpu=args.every_gpu,
                to=sys.stdout if args.to_stdout else None, host_only=args.host_only)


if __name__ == "__main__":
    main()
