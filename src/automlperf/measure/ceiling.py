"""A node's measured ceiling: the dense rate of its devices, in the precision the run trains
in, measured for a few seconds when its replica starts (and again once the run's time is
over, runner/replica.py, so that the result holds both: measure/interference.py): a GPU's matrix product (its vendor's
GEMM), a CPU's faster of a matrix product and a 3x3 convolution, each at the rate of its median
repetition (so that what else wakes on the node while it measures does not lower it).

It runs in a process of its own (``python -m automlperf.measure.ceiling``) so that neither its
thread settings nor a GPU context stay behind in the replica; the same process describes the
node (CPU, memory, accelerators with UUIDs, driver), which the replica records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Matrix side per device kind: large enough to reach the device's dense rate, small enough
# that one product takes well under the measuring time.
SIDE = {"cpu": 2048, "cuda": 8192}
# A CPU's BLAS may leave its widest vector units idle where oneDNN's convolutions use them,
# so that training outran a matmul-only ceiling (bench/RESULTS.md, "On a 2-core AMD EPYC
# (Zen 5, AVX-512), and the ceiling corrected"). Batch, channels in and out, side: a
# ResNet-50 stage-3 3x3 convolution.
CONV = (32, 256, 14)


def _operands(dev: Any, precision: str, *shapes: tuple[int, ...]) -> tuple[str, list[Any]]:
    """The run's precision resolved for ``dev``, and seeded random tensors of ``shapes`` there
    in it (made on the CPU, so that every device measures the same numbers)."""
    import torch

    from automlperf.train.device import resolve_precision

    resolved = resolve_precision(precision, dev)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolved, torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    return resolved, [torch.randn(*s, generator=gen).to(dev, dtype) for s in shapes]


def _timed(step: Callable[[], Any], seconds: float, group: int = 1,
           sync: Callable[[], None] = lambda: None) -> tuple[int, float, float]:
    """``step`` repeated for ``seconds``, timed in groups of ``group`` (a device that queues
    work is synchronised once a group): (repetitions, elapsed, the median group's seconds).

    The rate is taken from the median group, not from the elapsed time: on a 2-core node
    beside another process waking for 0.3 s of every second (as a sampler or a starting
    replica does), the mean over the time read 10-21 % below the median measured just
    after it, while idle the two agree within 4 % (bench/RESULTS.md). A ceiling is what
    the device does, not what other work left it."""
    step()  # warm-up: library initialisation, kernel choice and code generation
    sync()
    times: list[float] = []
    started = time.perf_counter()
    while True:
        began = time.perf_counter()
        for _ in range(group):
            step()
        sync()
        now = time.perf_counter()
        times.append(now - began)
        if now - started >= seconds:
            break
    return group * len(times), now - started, statistics.median(times) / group


def matmul_rate(device: str, precision: str, seconds: float = 2.0) -> dict[str, Any]:
    """Operations per second of n x n matrix products (2 n^3 each) on ``device``."""
    import torch

    dev = torch.device(device)
    n = SIDE.get(dev.type, 2048)
    resolved, (a, b) = _operands(dev, precision, (n, n), (n, n))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = resolved == "tf32"
    gpu = dev.type == "cuda"
    reps, elapsed, median = _timed(lambda: torch.mm(a, b), seconds, 8 if gpu else 1,
                                   (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None))
    ops = 2.0 * n**3
    return {"device": device, "precision": resolved, "side": n, "products": reps,
            "seconds": elapsed, "ops_per_s": ops / median, "mean_ops_per_s": ops * reps / elapsed}


def conv_rate(device: str, precision: str, seconds: float = 2.0) -> dict[str, Any]:
    """Operations per second (a multiply-accumulate counts 2) of 3x3 convolutions in the
    channels-last layout, without gradients, on ``device``."""
    import torch
    import torch.nn.functional as F

    n, c, side = CONV
    resolved, (x, w) = _operands(torch.device(device), precision, (n, c, side, side), (c, c, 3, 3))
    x, w = (v.contiguous(memory_format=torch.channels_last) for v in (x, w))
    with torch.inference_mode():
        reps, elapsed, median = _timed(lambda: F.conv2d(x, w, padding=1), seconds)
    ops = 2.0 * n * side * side * c * c * 9
    return {"device": device, "precision": resolved, "conv": list(CONV), "convolutions": reps,
            "seconds": elapsed, "ops_per_s": ops / median, "mean_ops_per_s": ops * reps / elapsed}


def cpu_rate(precision: str, seconds: float = 2.0) -> dict[str, Any]:
    """The faster of a matrix product and a convolution on the CPU, each timed for half of
    ``seconds``; both rates are kept."""
    product = matmul_rate("cpu", precision, seconds / 2)
    conv = conv_rate("cpu", precision, seconds / 2)
    best = max(product, conv, key=lambda r: r["ops_per_s"])
    return {**product, "kernel": "conv3x3" if best is conv else "matmul",
            "ops_per_s": best["ops_per_s"], "mean_ops_per_s": best["mean_ops_per_s"],
            "matmul_ops_per_s": product["ops_per_s"],
            "conv_ops_per_s": conv["ops_per_s"], "conv": conv["conv"],
            "convolutions": conv["convolutions"],
            "seconds": product["seconds"] + conv["seconds"]}


def measure_node(devices: list[str], precision: str, threads: int,
                 seconds: float = 2.0) -> dict[str, Any]:
    """The node's description and each of ``devices``' dense rate (CPU ranks share the
    node's cores: they are measured once, with all of this replica's threads)."""
    import torch

    from automlperf.measure.system import describe

    torch.set_num_threads(max(1, threads))
    rates = []
    for device in dict.fromkeys(devices):
        if device == "cpu":
            rate = {**cpu_rate(precision, seconds), "threads": threads}
        else:
            rate = {**matmul_rate(device, precision, seconds), "kernel": "matmul"}
        rates.append(rate)
    return {"system": describe(), "devices": devices, "ceiling": rates,
            "ceiling_ops": sum(r["ops_per_s"] for r in rates)}


def run_measurement(devices: list[str], precision: str, threads: int,
                    seconds: float = 2.0, timeout_s: float = 300.0) -> dict[str, Any]:
    """:func:`measure_node`; an error is reported, not raised (a node without a ceiling still
    trains and scores). CPU ranks are measured in this process (torch is loaded already and
    the thread setting is restored); GPUs in a process of their own, so that no GPU context
    stays behind (and a replica's process, which never loads torch, measures with
    :class:`EndMeasurement`)."""
    if all(d == "cpu" for d in devices):
        import torch

        before = torch.get_num_threads()
        try:
            return measure_node(devices, precision, threads, seconds)
        except Exception as exc:  # noqa: BLE001 - reported in the node's description
            return {"devices": devices, "error": f"the measurement failed: {exc}"}
        finally:
            torch.set_num_threads(before)
    try:
        done = subprocess.run(_command(devices, precision, threads, seconds),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"devices": devices, "error": f"the measurement took over {timeout_s:.0f} s"}
    return _answer(devices, done.returncode, done.stdout, done.stderr)


def _command(devices: list[str], precision: str, threads: int, seconds: float) -> list[str]:
    return [sys.executable, "-m", "automlperf.measure.ceiling", "--devices", ",".join(devices),
            "--precision", precision, "--threads", str(threads), "--seconds", str(seconds)]


def _answer(devices: list[str], returncode: int, out: str, err: str) -> dict[str, Any]:
    """A measuring process's node description, or its last line of error as the node's."""
    if returncode != 0:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return {"devices": devices, "error": f"the measurement failed: {tail[:300]}"}
    return json.loads(out.strip().splitlines()[-1])


class EndMeasurement:
    """:func:`run_measurement` in a process of its own that can be started before it is
    wanted (:meth:`prepare`) and measures only when called: its imports (torch, about 1.5
    CPU-s) then overlap the epoch in flight after the deadline instead of following the
    ranks' stop, while the measurement itself still waits for the ranks to be gone."""

    def __init__(self, devices: list[str], precision: str, threads: int,
                 seconds: float = 2.0, timeout_s: float = 300.0) -> None:
        self.devices = devices
        self.timeout_s = timeout_s
        self.cmd = [*_command(devices, precision, threads, seconds), "--when-told"]
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()  # prepared by one thread, called by another

    def prepare(self) -> None:
        """Start the process (it imports what it needs, then waits to be told); once."""
        with self._lock:
            if self._proc is None:
                self._proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True)

    def __call__(self) -> dict[str, Any]:
        self.prepare()
        proc = self._proc
        assert proc is not None
        try:
            out, err = proc.communicate("measure\n", timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            return {"devices": self.devices,
                    "error": f"the measurement took over {self.timeout_s:.0f} s"}
        except OSError as exc:  # the process died before it was told (a broken pipe)
            self.close()
            return {"devices": self.devices, "error": f"the measurement failed: {exc}"}
        return _answer(self.devices, proc.returncode, out, err)

    def close(self) -> None:
        """End the process if it is still there (a replica that never measured)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure this node's dense rate (its ceiling).")
    parser.add_argument("--devices", required=True, help="comma-separated, e.g. cuda:0,cuda:1")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--when-told", action="store_true",
                        help="import first, then measure once a line arrives on stdin")
    args = parser.parse_args()
    if args.when_told:
        import torch  # noqa: F401 - imported before the word, so that measuring starts at once

        from automlperf.measure import system  # noqa: F401

        if not sys.stdin.readline():
            return  # nobody will read the result: the replica went away
    result = measure_node(args.devices.split(","), args.precision, args.threads, args.seconds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
