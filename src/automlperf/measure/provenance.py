"""What produced a result: the automlperf source, the installed packages, the environment
variables that change performance, the container, and each node's hardware.

Recorded once per run by the primary (``collect``) and once per replica (``node``), stored in
the run's store and run directory, copied into result.json, and compared by ``check``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import subprocess
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path
from typing import Any

from automlperf import __version__
from automlperf.store.urls import redact

ENV_PREFIXES = ("NCCL_", "CUDA_", "OMP_", "TORCH_", "PYTORCH_", "SLURM_", "MKL_", "KMP_")
_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|(^|_)KEY($|_)", re.I)
_SOURCE_SUFFIXES = (".py", ".j2", ".txt", ".gz", ".toml")
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The performance-relevant variables, with secrets replaced by ***."""
    env = dict(os.environ if env is None else env)
    out = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIXES):
            continue
        out[name] = "***" if _SECRET_NAME.search(name) else redact(env[name])
    return out


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the package's own files (relative name and content), so two runs can be
    told apart even when their version numbers are equal."""
    digest = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*")
                       if p.is_file() and p.suffix in _SOURCE_SUFFIXES
                       and "__pycache__" not in p.parts):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


def git_state(package_dir: Path = PACKAGE_DIR) -> dict[str, Any] | None:
    """The commit and whether the checkout differs from it, when run from a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return {"commit": commit, "dirty": bool(status)}


def packages() -> dict[str, str]:
    """Every installed distribution and its version."""
    out = {}
    parser = HeaderParser()
    for dist in metadata.distributions():
        # Only the header block: ``dist.metadata`` parses the long description too, which
        # made this four times as costly, in every run's start-up.
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        head = parser.parsestr(text.split("\n\n", 1)[0])
        name = head["Name"]
        if name:
            out[name.lower()] = head["Version"]
    return dict(sorted(out.items()))


def container() -> dict[str, Any] | None:
    """The container this process runs in, as far as the runtime says."""
    for var in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        if os.environ.get(var):
            return {"runtime": var.split("_")[0].lower(), "image": os.environ[var],
                    "name": os.environ.get(var.replace("CONTAINER", "NAME"))}
    podman = Path("/run/.containerenv")
    if podman.exists():
        info: dict[str, Any] = {"runtime": "podman"}
        try:
            for line in podman.read_text().splitlines():
                key, _, value = line.partition("=")
                if key in ("image", "imageid", "name"):
                    info[key] = value.strip('"')
        except OSError:
            pass
        return info
    if Path("/.dockerenv").exists():
        return {"runtime": "docker", "image": os.environ.get("CONTAINER_IMAGE")}
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return {"runtime": "kubernetes", "image": os.environ.get("CONTAINER_IMAGE")}
    return None


@functools.cache
def software() -> dict[str, Any]:
    """What a replica trains with, recorded with its node's description: in a container that
    is the image's automlperf, Python and torch, not the batch host's the primary recorded."""
    try:
        torch: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {"automlperf_version": __version__, "source_hash": source_hash(),
            "python": platform.python_version(), "torch": torch, "container": container()}


def collect() -> dict[str, Any]:
    """The run's provenance, recorded by the primary when the run is created."""
    return {"automlperf_version": __version__, "source_hash": source_hash(),
            "git": git_state(), "packages": packages(), "environment": environment(),
            "container": container()}


def digest(record: Any) -> str:
    """A stable hash of a JSON-like record, for comparing copies."""
    import json

    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
