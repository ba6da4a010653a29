"""The archives staged on a node, hashed by the replica that reads them.

Staging computes each archive's MD5 while it copies it and records it in
``RUN_DIR/staging/<node>.json`` (runner/staging.py); the replica reads the copy only if those
MD5s are the ones its session proved (runner/nodedata.py). But a record is a file, and a file
can be written by hand: nothing the run persists counts as proof. So the replica computes the
copy's MD5s itself, during its session, in a thread beside the training (one stream: a core for
some 4.4 minutes at ImageNet's 154.6 GB, bench/RESULTS.md, taken from the training's time;
where every core is busy, the kernel shares them), and records them in its node description
at its end (:meth:`StagedCheck.record`). The result holds them to the
MD5s the run proved (measure/result.py ``data_changes``): a copy that differs, or that its
replica did not finish hashing, keeps the result from being valid, naming the replica.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from automlperf.dataset.archive import NAMES, md5_of
from automlperf.dataset.index import DatasetIdentityError

log = logging.getLogger("automlperf.replica")


class StagedCheck:
    """The MD5s of the archives staged in ``root``, computed in a thread started here."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.md5: dict[str, str] = {}
        self.error: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._work, name="automlperf-staged-md5", daemon=True).start()

    def _work(self) -> None:
        try:
            for part, name in NAMES.items():
                self.md5[part], _ = md5_of(self.root / name)
            log.info("the archives staged on this node have the MD5s their replica computed: "
                     "%s", ", ".join(f"{NAMES[p]} {m}" for p, m in self.md5.items()))
        except (OSError, DatasetIdentityError) as exc:
            self.error = f"{exc}"
            log.warning("the archives staged on this node could not be hashed: %s", exc)
        finally:
            self.done.set()

    def record(self, wait_s: float | None = None) -> dict[str, Any]:
        """What the replica's node description records of the check, once it is done (waiting
        up to ``wait_s``): the MD5s it computed (``computed``), or why it could not
        (``computed_error``), or that it was not finished (``computed`` None)."""
        self.done.wait(wait_s)
        if not self.done.is_set():
            return {"computed": None}
        if self.error is not None:
            return {"computed": None, "computed_error": self.error}
        return {"computed": dict(self.md5)}
