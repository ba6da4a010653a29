"""The run's data staged on each node before the clock: ``automlperf stage``, run once per
node by the batch job (``automlperf slurm --stage-to DIR``).

Without it every node reads the data from the shared file system every epoch. A staged node
copies it once, to its own storage, records where in ``RUN_DIR/staging/<node>.json``, and its
replica reads the copy (runner/nodedata.py). A node whose staging fails says why in its log,
and its replica reads the shared copy; each replica's node description says which it read,
and result.json counts them (``data_sources``).

* The official archives (this module): three large files copied one after the other, each
  read once, sequentially, its MD5 computed on the way (the replica holds it to the MD5s its
  session proved), the free space checked first, the copy written to disk (``fsync``) and
  verified by reading it back from the disk (a CRC-32 of what was read against one of what was
  written), the seconds of each part recorded. A copy already there (a resubmitted job, a
  chain's next job on the node) is read again, not copied: its MD5 is this job's own.
* A folder (runner/stagefolder.py): the files of the run's index copied one by one, for
  unofficial runs; at scale its metadata operations are the shared file system's problem
  (``bench/RESULTS.md``, "Staging that fits 512 nodes").

The copy is removed with ``--clean`` at the job's end; the record stays, renamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import socket
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.dataset.archive import NAMES, identity_of, is_archive_folder
from automlperf.dataset.shared import node_name
from automlperf.runner.stagefolder import StagingError, stage_folder
from automlperf.store.rundir import RunDir, write_atomic

__all__ = ["StagingError", "clean", "local_record", "local_root", "stage", "staged_root"]

STAGING = "staging"
HEADROOM = 1.02  # the file system's own blocks beside the files' bytes
CHUNK = 8 << 20


def record_path(run_dir: Path, node: str | None = None) -> Path:
    return Path(run_dir) / STAGING / f"{node or node_name()}.json"


def staged_root(run_dir: Path, local: Path, node: str | None = None) -> Path:
    """Where a run's copy lives under a node's local folder (this node's, or ``node``'s):
    one folder per run and node (a folder that several nodes share, a burst buffer, then
    holds one copy each)."""
    return Path(local) / f"automlperf-{Path(run_dir).resolve().name}-{node or node_name()}"


def run_data_dir(run_dir: Path) -> Path | None:
    """The data folder of the run's configuration (the submitted one before the run began)."""
    rd = RunDir(Path(run_dir))
    path = rd.config if rd.config.exists() else Path(run_dir) / "submitted-config.toml"
    if not path.exists():
        return None
    data_dir = Config.load(path).data.data_dir
    return None if data_dir is None else Path(data_dir)


def stage(run_dir: Path, local: Path, threads: int = 16, seed: int | None = None) -> dict[str, Any]:
    """Stage the run's data on this node, check it, and record it; what was recorded. This
    node's record of an earlier job goes first: a failed staging leaves none."""
    record = record_path(run_dir)
    record.unlink(missing_ok=True)
    source = run_data_dir(run_dir)
    try:
        if source is not None and is_archive_folder(source):
            done = stage_archives(run_dir, source, local)
        else:
            done = stage_folder(run_dir, staged_root(run_dir, local), local, threads, seed)
    except OSError as exc:
        raise StagingError(f"staging on {node_name()} failed: {exc}; its replica reads the "
                           "shared copy (check the node's --stage-to storage)") from None
    record.parent.mkdir(exist_ok=True)
    write_atomic(record, json.dumps(done, indent=1) + "\n")
    return done


def _copy(src: Path, dst: Path) -> tuple[str, int, float]:
    """Copy ``src`` to ``dst`` in large sequential reads, hashing what is read (MD5, and a
    CRC-32 to verify the copy by) in a thread beside the reads and writes; (MD5, CRC-32,
    seconds)."""
    started = time.perf_counter()
    md5, crc = hashlib.md5(), [0]
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)

    def digest() -> None:
        while (chunk := chunks.get()) is not None:
            md5.update(chunk)
            crc[0] = zlib.crc32(chunk, crc[0])

    hasher = threading.Thread(target=digest, name="automlperf-stage-md5", daemon=True)
    hasher.start()
    part = dst.with_name(dst.name + ".part")
    try:
        with open(src, "rb", buffering=0) as fin, open(part, "wb", buffering=0) as fout:
            try:
                os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except (OSError, AttributeError):
                pass
            while chunk := fin.read(CHUNK):
                chunks.put(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[fout.write(view):]
            os.fsync(fout.fileno())
    finally:
        chunks.put(None)
        hasher.join()
    os.replace(part, dst)
    return md5.hexdigest(), crc[0], time.perf_counter() - started


def _read_back(path: Path, md5: bool) -> tuple[str | None, int, float]:
    """(MD5 if asked, CRC-32, seconds) of a file read from the disk (its pages dropped from
    the cache first, so that the disk's copy is what is read)."""
    started = time.perf_counter()
    digest, crc = hashlib.md5() if md5 else None, 0
    with open(path, "rb", buffering=0) as f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        while chunk := f.read(CHUNK):
            if digest is not None:
                digest.update(chunk)
            crc = zlib.crc32(chunk, crc)
    return None if digest is None else digest.hexdigest(), crc, time.perf_counter() - started


def stage_archives(run_dir: Path, source: Path, local: Path) -> dict[str, Any]:
    """Copy the three archives to this node, one after the other (see the module's
    description); what the node's record holds."""
    started = time.perf_counter()
    target = staged_root(run_dir, local)
    if not Path(local).is_dir():
        raise StagingError(f"{local} does not exist on {node_name()}: give --stage-to a "
                           "node-local folder that exists on every node (its own mount)")
    sizes = {}
    for part, name in NAMES.items():
        try:
            sizes[part] = (source / name).stat().st_size
        except OSError as exc:
            raise StagingError(f"{source / name} is not readable on {node_name()} "
                               f"({exc.strerror or exc}): staging reads the shared copy once") from None
    have = {part: (target / name).stat().st_size if (target / name).is_file() else -1
            for part, name in NAMES.items()}
    need = sum(size for part, size in sizes.items() if have[part] != size)
    free = shutil.disk_usage(local).free
    if need * HEADROOM > free:
        raise StagingError(f"{local} on {node_name()} has {free / 1e9:.2f} GB free and the "
                           f"archives need {need / 1e9:.2f} GB more: give --stage-to a larger "
                           "node-local folder, or run without staging")
    target.mkdir(exist_ok=True)
    archives: dict[str, Any] = {}
    copied = 0
    times = {"copy_s": 0.0, "verify_s": 0.0, "hash_kept_s": 0.0}
    for part, name in NAMES.items():
        dst = target / name
        if have[part] == sizes[part]:
            # Kept from an earlier job on this node: read again, its MD5 this job's own.
            kept, _, seconds = _read_back(dst, md5=True)
            assert kept is not None
            md5 = kept
            times["hash_kept_s"] += seconds
        else:
            md5, crc, seconds = _copy(source / name, dst)
            times["copy_s"] += seconds
            copied += sizes[part]
            _, crc_back, verify_s = _read_back(dst, md5=False)
            times["verify_s"] += verify_s
            if crc_back != crc:
                dst.unlink(missing_ok=True)
                raise StagingError(f"{dst} differs from what was copied into it (read back "
                                   "from the disk): the local disk is damaged; stage again, "
                                   "or run without staging")
        archives[part] = {"name": name, "md5": md5, **identity_of(os.stat(dst))}
    total = sum(sizes.values())
    return {"kind": "archives", "node": node_name(), "host": socket.gethostname(),
            "root": str(target), "source": str(source), "files": len(NAMES), "bytes": total,
            "copied_bytes": copied, "archives": archives,
            # To the microsecond: a small archive read back from the page cache takes less
            # than half a millisecond, and a time rounded to nothing reads as not measured.
            **{k: round(v, 6) for k, v in times.items()},
            "staging_s": round(time.perf_counter() - started, 3), "at": time.time()}


def clean(run_dir: Path, local: Path) -> bool:
    """Remove this node's copy of the run's data; whether there was one. Its record stays
    in the run directory, as ``<node>-<time>.json`` (what the run read, and from where),
    where no replica takes it for a copy that is there."""
    target = staged_root(run_dir, local)
    record = record_path(run_dir)
    if record.exists():
        kept = json.loads(record.read_text())
        kept["removed_at"] = time.time()
        write_atomic(record.with_name(f"{record.stem}-{int(kept['at'])}.json"),
                     json.dumps(kept, indent=1) + "\n")
        record.unlink()
    if not target.is_dir():
        return False
    shutil.rmtree(target)
    return True


def local_record(run_dir: Path) -> dict[str, Any] | None:
    """This node's staging record, if its copy is there to read."""
    try:
        record = json.loads(record_path(run_dir).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) and "root" in record else None


def local_root(run_dir: Path) -> str | None:
    """This node's staged copy of the run's data, if its record says there is one."""
    record = local_record(run_dir)
    return None if record is None else str(record["root"])
