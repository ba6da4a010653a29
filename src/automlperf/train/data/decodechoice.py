"""Which path decodes an image folder's JPEGs on a node: the CPU workers or nvJPEG on the GPU,
and why.

``data.gpu_decode`` set decides. Unset, the choice is automatic and made by measurement:
`automlperf doctor` measures both paths in a process set up as a rank, beside the trial's own
steps, and keeps the faster here; runs read it. Until the GPU path has won on a node, the CPU
workers decode there: on the lent H200s the GPU path fed a rank less than they did.

One JSON file per user, ``$XDG_CACHE_HOME/automlperf/decode-path.json`` (beside the compile
figures), its entries keyed by what the comparison depends on: the GPU's product name, the
torch version, the decoder with its libraries' versions and the decoding workers a rank has.
A file that cannot be read, or of another format, is no measurement.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from automlperf.train.rankenv import user_cache_dir
from automlperf.train.usercache import read_entries, write_entries

FILE = "decode-path.json"
FORMAT = 1


@dataclass(frozen=True)
class PathKey:
    """What a comparison of the two paths was measured with."""

    device: str  # the GPU's product name
    torch: str
    decoder: str  # the GPU decoder and its libraries' versions (gpudecode.describe)
    workers: int  # the CPU path's decoding workers per rank


@dataclass(frozen=True)
class Choice:
    """The path that decodes (``gpu``: nvJPEG) and why, in words a result can carry; where
    both paths were measured, the GPU path's ``margin`` over the CPU's (a share of the CPU
    path's rate) and the probes' own ``noise`` (their spread, train/loaderprobe.py)."""

    gpu: bool
    why: str
    margin: float | None = None
    noise: float | None = None

    @property
    def path(self) -> str:
        return "gpu" if self.gpu else "cpu"

    @property
    def within_noise(self) -> bool | None:
        if self.margin is None or self.noise is None:
            return None
        return abs(self.margin) < self.noise


def cache_path() -> Path:
    return user_cache_dir() / FILE


def _entries(path: Path) -> list[dict[str, Any]]:
    return read_entries(path, FORMAT)


# The probes' spread assumed where neither measured its own (a probe too short for four
# intervals between progress reports): two 12-second probes on a GPU differ by about 2 %.
NOISE_UNMEASURED = 0.03


def winner(cpu_images_per_s: float, gpu_images_per_s: float | None,
           noise: float | None = None) -> Choice:
    """The faster path beside training (the GPU path must be faster to be chosen), with its
    margin, said to be within noise where the two differ by less than ``noise`` (the probes'
    spread; NOISE_UNMEASURED where None)."""
    if gpu_images_per_s is None:
        return Choice(False, "the GPU path was not measured")
    gpu = gpu_images_per_s > cpu_images_per_s
    margin = gpu_images_per_s / cpu_images_per_s - 1 if cpu_images_per_s > 0 else None
    spread = NOISE_UNMEASURED if noise is None else noise
    words = (f"beside training, the GPU path fed {gpu_images_per_s:,.0f} img/s and the CPU "
             f"workers {cpu_images_per_s:,.0f}")
    if margin is not None:
        measured = "the probes' own spread" if noise is not None else "an assumed spread"
        words += (f" ({margin:+.1%}: within noise, {measured} being {spread:.1%})"
                  if abs(margin) < spread else f" ({margin:+.1%}, beyond {measured} of {spread:.1%})")
    return Choice(gpu, words, margin, spread)


def save(key: PathKey, cpu_images_per_s: float, gpu_images_per_s: float, data_dir: str,
         path: Path | None = None, noise: float | None = None) -> Choice:
    """Keep the comparison under ``key`` (replacing one of the same key), with the probes'
    spread (``noise``); the file is replaced whole, so a reader never sees half of it.
    Raises OSError when it cannot be written."""
    path = path or cache_path()
    entries = [e for e in _entries(path) if e.get("key") != asdict(key)]
    entries.append({"key": asdict(key), "cpu_images_per_s": cpu_images_per_s,
                    "gpu_images_per_s": gpu_images_per_s, "noise": noise, "data_dir": data_dir,
                    "measured_at": time.time()})
    write_entries(path, FORMAT, entries)
    return winner(cpu_images_per_s, gpu_images_per_s, noise)


def measured(key: PathKey, path: Path | None = None) -> Choice | None:
    """The doctor's choice kept for ``key``, or None where it never compared the paths."""
    path = path or cache_path()
    for entry in _entries(path):
        if entry.get("key") != asdict(key):
            continue
        try:
            cpu, gpu = float(entry["cpu_images_per_s"]), float(entry["gpu_images_per_s"])
            when = time.strftime("%Y-%m-%d", time.gmtime(float(entry["measured_at"])))
            noise = None if entry.get("noise") is None else float(entry["noise"])
        except (KeyError, TypeError, ValueError):
            return None
        found = winner(cpu, gpu, noise)
        return Choice(found.gpu, f"automatic: {found.why} (automlperf doctor, {when}, "
                                 f"kept in {path})", found.margin, found.noise)
    return None


def choose(gpu_decode: bool | None, cuda: bool, decoder: str | None,
           key: PathKey | None, path: Path | None = None) -> Choice:
    """The path for ``data.gpu_decode``: set, it decides; unset, the doctor's measurement on
    this node (``key``) where the ranks have NVIDIA GPUs (``cuda``) and a GPU decoder
    imports (``decoder``, its description), else the CPU workers."""
    if gpu_decode is not None:
        return Choice(gpu_decode, f"set: data.gpu_decode = {str(gpu_decode).lower()}")
    if not cuda:
        return Choice(False, "automatic: the ranks have no NVIDIA GPU")
    if decoder is None:
        return Choice(False, "automatic: no nvJPEG decoder is installed (pip install "
                             "'automlperf[nvjpeg]')")
    found = measured(key, path) if key is not None else None
    if found is None:
        return Choice(False, "automatic: the two paths were never compared on this node "
                             "(automlperf doctor compares them); the CPU workers until the "
                             "GPU path wins")
    return found


def key_for(decoder: str, workers: int) -> PathKey:
    """The key of this node's first GPU, in this process's torch."""
    import torch

    from automlperf.hardware import device_name

    return PathKey(device_name(torch, torch.device("cuda", 0)), str(torch.__version__), decoder,
                   int(workers))
