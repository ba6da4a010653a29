"""The small JSON files `automlperf doctor` keeps in the user's cache folder for the runs after
it (compile figures, the decode path): a format number and a list of entries, each file
replaced whole so that a reader never sees half of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_entries(path: Path, fmt: int) -> list[dict[str, Any]]:
    """The entries of ``path``; none where it cannot be read or is of another format (its
    figures were measured otherwise)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != fmt:
        return []
    return [e for e in data.get("entries") or [] if isinstance(e, dict)]


def write_entries(path: Path, fmt: int, entries: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``entries``; raises OSError when it cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(json.dumps({"format": fmt, "entries": entries}, indent=1) + "\n")
    os.replace(part, path)
