"""The settings a rank process puts into its environment before PyTorch reads them.

They are read once, when the CUDA allocator starts and when Inductor's configuration is first
imported, so they must be in place before the rank touches its device or compiles; a value
the user set is kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

# Where a user may have configured the caching allocator (the first is PyTorch 2.9's name; the
# second, which the rank sets, is the one every supported PyTorch reads).
ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
ALLOC_VAR = "PYTORCH_CUDA_ALLOC_CONF"
# Blocks that grow in place instead of new fixed-size segments: trials of different shapes in
# one long-lived rank fragment the cache far less.
ALLOC_DEFAULT = "expandable_segments:True"
COMPILE_THREADS_VAR = "TORCHINDUCTOR_COMPILE_THREADS"
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
# glibc's mallopt parameters, and the size below which a CPU rank keeps freed memory for reuse.
# By default glibc maps every block above 32 MiB afresh and unmaps it when freed, so a CPU
# rank page-faults its whole activation memory in (zeroed by the kernel) at every step
# (bench/RESULTS.md, "What the code's comments rest on").
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HOST_KEEP_BYTES = 1 << 30


# Cores a rank's GPU decoding path keeps busy: its workers only read files and parse their
# headers (a third of a core at an H100's rate: bench/RESULTS.md, "The GPU path's host side")
# and the rank's threads launch the steps and the decoder's calls.
GPU_PATH_BUSY_CORES = 2


def compile_threads(rank_threads: int, decode_workers: int, gpu_path: bool = False) -> int:
    """Inductor's compile workers for a rank: the cores its decoding workers leave over, at
    least one (Inductor would otherwise start one per core of the node, beside every rank's
    decoding workers). On the GPU decoding path (``gpu_path``) the workers leave nearly all
    of them idle: all but GPU_PATH_BUSY_CORES."""
    if gpu_path:
        return max(1, rank_threads - GPU_PATH_BUSY_CORES)
    return max(1, rank_threads - decode_workers)


def rank_threads(device_type: str, threads: int) -> int:
    """Intra-op threads of a rank with ``threads`` cores: all of them on a CPU, whose steps
    run in them; one on an accelerator, whose CPU math is the loader's hand-over of a batch
    and a trial's set-up: more would spin beside the decoding workers, which need the
    cores (torchrun sets OMP_NUM_THREADS=1 for the same reason)."""
    return max(1, threads) if device_type == "cpu" else 1


def user_cache_dir() -> Path:
    """This user's cache of automlperf: ``$XDG_CACHE_HOME/automlperf`` (``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "automlperf"


def inductor_cache_dir() -> str:
    """Where a rank's compiled graphs are kept: beside the compile figures
    (train/compilecache.py), not in the temporary folder that is Inductor's default and that
    batch systems often make private to each job. There the graphs `automlperf doctor`
    compiled on a node serve the trials of the runs after it (Inductor's graph and AOT
    autograd caches; their keys hold the device, torch and shapes)."""
    return str(user_cache_dir() / "inductor")


def set_rank_environment(rank_threads: int, decode_workers: int,
                         env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Put the allocator, compile-thread and compile-cache defaults into ``env``
    (``os.environ``) unless the user chose them; returns what was set."""
    env = os.environ if env is None else env
    chosen: dict[str, str] = {}
    if not any(env.get(name) for name in ALLOC_VARS):
        chosen[ALLOC_VAR] = ALLOC_DEFAULT
    if not env.get(COMPILE_THREADS_VAR):
        chosen[COMPILE_THREADS_VAR] = str(compile_threads(rank_threads, decode_workers))
    if not env.get(INDUCTOR_CACHE_VAR):
        chosen[INDUCTOR_CACHE_VAR] = inductor_cache_dir()
    env.update(chosen)
    return chosen


def decoding_on_gpu(rank_threads: int, chosen: dict[str, str],
                    env: MutableMapping[str, str] | None = None) -> int | None:
    """Once a rank's dataset decodes on the GPU: its compile workers get the cores the
    decoding workers leave idle (:func:`compile_threads`), where :func:`set_rank_environment`
    chose their number (``chosen``, what it returned) and not the user; the number, or None.
    Inductor reads it when a trial compiles (train/compiling.py ``compile_module``)."""
    env = os.environ if env is None else env
    if COMPILE_THREADS_VAR not in chosen:
        return None
    threads = compile_threads(rank_threads, 0, gpu_path=True)
    chosen[COMPILE_THREADS_VAR] = env[COMPILE_THREADS_VAR] = str(threads)
    return threads


def configured_compile_threads(default: int) -> int:
    """The compile threads the environment asks for (a rank sets it at start), else ``default``."""
    try:
        return max(1, int(os.environ.get(COMPILE_THREADS_VAR, "")))
    except ValueError:
        return max(1, default)


def take_device(device: Any, threads: int) -> None:
    """Set up this process for training on ``device`` (a ``torch.device``), as a rank does:
    its intra-op threads, host memory kept on CPUs, the current device on accelerators."""
    import torch

    torch.set_num_threads(rank_threads(device.type, threads))
    if device.type == "cpu":
        keep_host_memory()
    elif device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.accelerator.set_device_index(device.index)


def keep_host_memory(limit: int = HOST_KEEP_BYTES) -> bool:
    """Have glibc serve blocks up to ``limit`` from the heap and keep freed ones for the next
    step instead of returning them to the kernel. For ranks that train on the CPU, whose
    tensors live in host memory; the process then holds its peak memory between trials,
    which the next trial needs again. False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    value = min(limit, 2**31 - 1)
    return bool(mallopt(M_MMAP_THRESHOLD, value)) and bool(mallopt(M_TRIM_THRESHOLD, value))
