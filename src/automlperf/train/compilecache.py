"""Compilation figures `automlperf doctor` measured on this node, kept for the runs after it.

A rank does not measure compilation inside a run's clock: on one H200 that measurement
held the first trial's first epoch back 79 s of a 200 s run, for steps 1 % faster
compiled, and the rank then stayed eager. A
trial left to the compile rule decides with the figures it is given
(``train.compile_figures``), else with the doctor's, read here, else stays eager.

One JSON file per user, ``$XDG_CACHE_HOME/automlperf/compile-figures.json`` (default
``~/.cache``); the doctor's input-pipeline item adds what the rank's loader delivers alone to
the figures of its device (:func:`note_loader_rate`). Its entries are keyed by what the
figures depend on: the device's product name (a CPU's model), the torch version, the
precision and the layout, and the per-rank batch they were measured at. A lookup matches the
first four exactly, so figures from another device or another torch never decide, and takes
the entry of the same batch, else of the nearest (the rates are per operation, as they serve
other architectures). A file that cannot be read, or of another format (figures measured
otherwise), is no figures.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from automlperf.train.compiling import CompileFigures
from automlperf.train.rankenv import user_cache_dir
from automlperf.train.usercache import read_entries, write_entries

FILE = "compile-figures.json"
# 2: an epoch's short last batch runs eagerly (train.compiling.eager_stance); format 1's
# costs include compiling a second graph for it, and are measured again, not used.
FORMAT = 2


@dataclass(frozen=True)
class FiguresKey:
    """What compilation figures were measured with."""

    device: str  # the product name ("NVIDIA H200"; a CPU: "cpu: " and its model)
    torch: str  # torch.__version__
    precision: str  # the precision the steps ran in (bf16, fp32, ...)
    channels_last: bool
    batch: int  # images per rank and step

    def same_setup(self, other: FiguresKey) -> bool:
        return (self.device, self.torch, self.precision, self.channels_last) == (
            other.device, other.torch, other.precision, other.channels_last)


def cache_path() -> Path:
    """Where this user's figures are kept."""
    return user_cache_dir() / FILE


def key_for(device: Any, precision: str, channels_last: bool, batch: int) -> FiguresKey:
    """The key of figures measured on the torch ``device`` in this process's torch."""
    import torch

    from automlperf.hardware import cpu_model, device_name

    device = torch.device(device)
    name = f"cpu: {cpu_model()}" if device.type == "cpu" else device_name(torch, device)
    return FiguresKey(name, str(torch.__version__), precision, bool(channels_last), int(batch))


def _entries(path: Path) -> list[dict[str, Any]]:
    return read_entries(path, FORMAT)


def save_figures(key: FiguresKey, figures: CompileFigures, path: Path | None = None) -> Path:
    """Keep ``figures`` under ``key``, replacing an entry of the same key; the file is
    replaced whole, so a reader never sees half of it. Raises OSError when it cannot be
    written."""
    path = path or cache_path()
    entries = [e for e in _entries(path) if e.get("key") != asdict(key)]
    entries.append({"key": asdict(key), "figures": figures.to_dict(), "measured_at": time.time()})
    write_entries(path, FORMAT, entries)
    return path


def cached_figures(key: FiguresKey, path: Path | None = None) -> CompileFigures | None:
    """The figures kept for ``key``'s device, torch, precision and layout, at its batch or
    the nearest; their source says where they came from. None when there are none."""
    path = path or cache_path()
    found: list[tuple[int, FiguresKey, CompileFigures]] = []
    for entry in _entries(path):
        try:
            kept = FiguresKey(**entry["key"])
            figures = CompileFigures.from_dict(entry["figures"])
        except (KeyError, TypeError, ValueError):
            continue
        if kept.same_setup(key):
            found.append((abs(kept.batch - key.batch), kept, figures))
    if not found:
        return None
    _, kept, figures = min(found, key=lambda f: (f[0], -f[1].batch))
    where = f"cached in {path}" + ("" if kept.batch == key.batch else f", at batch {kept.batch}")
    return replace(figures, source=f"{figures.source} ({where})" if figures.source else where)


def note_loader_rate(device: Any, images_per_s: float, path: Path | None = None) -> int:
    """Give the figures kept for ``device`` in this torch (every precision, layout and
    batch) what the rank's loader delivers alone, which caps the rates they compare; returns
    how many entries it was given to. Raises OSError when the file cannot be written."""
    path = path or cache_path()
    mine = key_for(device, "", False, 1)
    entries = _entries(path)
    given = 0
    for entry in entries:
        key = entry.get("key")
        if isinstance(key, dict) and key.get("device") == mine.device and \
                key.get("torch") == mine.torch and isinstance(entry.get("figures"), dict):
            entry["figures"]["loader_images_per_s"] = float(images_per_s)
            given += 1
    if given:
        write_entries(path, FORMAT, entries)
    return given
