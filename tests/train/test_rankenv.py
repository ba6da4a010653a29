"""The host allocator a CPU rank sets up: freed activation memory is kept for the next step
instead of being unmapped and page-faulted back in (counted, so no speed is assumed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A step's worth of large blocks (two of 64 MiB, written), freed and allocated again, as a
# training step does: page faults per step once the heap has settled (aligned allocations
# take a few steps to find their places).
_PROBE = """
import json, resource, sys
import torch
from automlperf.train.rankenv import keep_host_memory
kept = keep_host_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    blocks = [torch.ones(64 << 20 >> 2) for _ in range(2)]
    del blocks
for _ in range(8):
    step()
before = faults()
for _ in range(4):
    step()
print(json.dumps({"kept": kept, "faults_per_repeat": (faults() - before) / 4}))
"""


def _probe(mode: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                          timeout=600, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_cpu_rank_keeps_freed_blocks_instead_of_faulting_them_back_in():
    default, kept = _probe("default"), _probe("keep")
    assert kept["kept"] is True
    pages = (2 * (64 << 20)) // 4096  # what the default pays in every repeat
    assert default["faults_per_repeat"] >= 0.9 * pages
    assert kept["faults_per_repeat"] < 0.05 * pages


def test_an_accelerator_rank_leaves_its_cores_to_the_decoding_workers():
    from automlperf.train.rankenv import rank_threads

    assert rank_threads("cpu", 16) == 16 and rank_threads("cpu", 0) == 1
    assert rank_threads("cuda", 16) == 1 and rank_threads("xpu", 8) == 1


def test_a_rank_decoding_on_its_gpu_compiles_with_the_cores_its_workers_leave_idle():
    """16 cores a rank: the CPU path's 15 workers leave one for compiling; on the GPU path
    they only read files, and compiling gets all but two. A number the user set stands."""
    from automlperf.train.rankenv import (COMPILE_THREADS_VAR, compile_threads,
                                          decoding_on_gpu, set_rank_environment)

    assert compile_threads(16, 15) == 1 and compile_threads(16, 15, gpu_path=True) == 14
    assert compile_threads(2, 1, gpu_path=True) == 1
    env: dict[str, str] = {}
    chosen = set_rank_environment(16, 15, env)
    assert env[COMPILE_THREADS_VAR] == "1"
    assert decoding_on_gpu(16, chosen, env) == 14 and env[COMPILE_THREADS_VAR] == "14"
    mine = {COMPILE_THREADS_VAR: "3"}
    assert decoding_on_gpu(16, set_rank_environment(16, 15, mine), mine) is None
    assert mine[COMPILE_THREADS_VAR] == "3"
