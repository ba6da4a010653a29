"""A session's data, before its clock: read once, identified, and for the official archives
proven by the session's own computation (automlperf.dataset.proof).

* A new run identifies its data (:func:`identify`) as part of what it records beside the
  system description; a resumed session proves the archives again (:func:`reprove`) and
  records what it found in ``system["data_sessions"]``: nothing an earlier session stored
  stands for this one's proof.
* The archives' pass (MD5s and index, the start-up's longest part at ImageNet's 144 GB) is
  started first (:func:`begin`) and runs in a thread beside the rest of the primary's start-up
  (its imports, the system description, the store); its seconds are recorded in ``startup``.
* At the session's end the primary looks at the archives again (:func:`recheck`): one that
  changed during the session is recorded, and the result is not valid, naming it.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from automlperf import rules
from automlperf.config import Config, ConfigError
from automlperf.dataset.archive import NAMES, Pass, is_archive_folder
from automlperf.dataset.folder import problems, scan
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError
from automlperf.dataset.proof import CHANGED, archive_identities, check_identity, prove, sessions
from automlperf.dataset.shared import SHARED_INDEX, build_shared_index, load_shared_index
from automlperf.store import Store
from automlperf.store.rundir import RunDir, write_atomic

UNOFFICIAL_HINT = "to run on it anyway as an unofficial run, pass --unofficial"
ARCHIVE_LIST = ", ".join(NAMES.values())

Proving = Future  # a pass begun by :func:`begin`: (Pass, identity)


def folder_refusal(data_dir: Path | str, ruleset: rules.Ruleset) -> str:
    """Why a folder is not the official data under ``ruleset`` (which proves the archives)."""
    return (f"{data_dir} is a folder of images, and ruleset {ruleset.id} reads ImageNet-1k "
            f"only from its official archives ({ARCHIVE_LIST}), a folder never, however it was "
            "proven: give --data-dir the folder that holds the archives")


def _archives(config: Config | None) -> Path | None:
    data = None if config is None else config.data
    if data is None or data.dataset != "imagenet" or data.data_dir is None:
        return None
    return Path(data.data_dir) if is_archive_folder(data.data_dir) else None


def begin(config: Config | None, ruleset: rules.Ruleset = rules.CURRENT) -> Proving | None:
    """The archives' pass of ``config``'s data, started in a thread now (None: the run does
    not read archives). Nothing is written: the session saves the index once it has checked
    its run directory."""
    root = _archives(config)
    if root is None:
        return None
    future: Proving = Future()

    def work() -> None:
        try:
            future.set_result(prove(root, ruleset))
        except BaseException as exc:  # noqa: BLE001 - handed to the session, which raises it
            future.set_exception(exc)

    # A daemon: a run refused meanwhile (its run directory, its store) exits without
    # waiting for the pass.
    threading.Thread(target=work, name="automlperf-proof", daemon=True).start()
    return future


def _proven(root: Path, ruleset: rules.Ruleset, proving: Proving | None,
            run_dir: Path | None) -> tuple[Pass, dict[str, Any]]:
    found, identity = proving.result() if proving is not None else prove(root, ruleset)
    if run_dir is not None:
        assert found.index is not None
        found.index.save(Path(run_dir) / SHARED_INDEX, identity=identity,
                         digest=identity["fingerprint"], scan_s=round(found.seconds, 3))
    return found, identity


def identify(config: Config, ruleset: rules.Ruleset, run_dir: Path | None,
             proving: Proving | None = None,
             proof: bool = True) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The identity a new run records of its data, and what its start-up records of how it
    was had: the archives proven (their pass, ``proving`` if begun; with ``proof`` off only
    seen to be there, as a job's submission does) or a folder walked, its index saved in
    ``run_dir`` for the replicas. A run held to the rules (:meth:`Config.strict`) on data
    that is not the ruleset's dataset is refused here, before anything is written."""
    data = config.data
    if data.dataset != ruleset.dataset.name or data.data_dir is None:
        return None, {}
    root = Path(data.data_dir)
    note: dict[str, Any] = {}
    try:
        if is_archive_folder(root) and not proof:
            identity = _present(root)
        elif is_archive_folder(root):
            found, identity = _proven(root, ruleset, proving, run_dir)
            note = {"dataset_index": "proven", "dataset_scan_s": round(found.seconds, 3),
                    "data_proof_s": round(found.seconds, 3),
                    "data_proof_mb_s": round(found.mb_per_s, 1)}
        else:
            # A folder that a ruleset of archives refuses is only read for what else it lacks.
            refused = config.strict() and ruleset.archive_proof
            identity, note = _folder(root, ruleset, None if refused else run_dir)
    except DatasetIdentityError as exc:
        if config.strict():
            raise ConfigError(f"official run refused: {exc}; {UNOFFICIAL_HINT}") from None
        # An unofficial run goes on; its replicas say why they cannot read the data.
        identity = {"layout": None, "classes": 0, "train_images": 0, "val_images": 0,
                    "files": 0, "fingerprint": None, "problems": [str(exc)]}
    if config.strict() and identity["problems"]:
        raise ConfigError(f"official run refused: {root} is not {ruleset.dataset.name} as "
                          f"ruleset {ruleset.id} defines it: " + "; ".join(identity["problems"])
                          + f"; {UNOFFICIAL_HINT}")
    return identity, note


def _present(root: Path) -> dict[str, Any]:
    """The archives seen to be there and readable, unproven (a job's submission: the job's
    own sessions prove them)."""
    missing = [name for name in NAMES.values() if not (root / name).is_file()]
    if missing:
        raise DatasetIdentityError(f"{root / missing[0]} not found: an ImageNet-1k archive "
                                   f"folder holds {ARCHIVE_LIST}")
    for name in NAMES.values():
        with open(root / name, "rb"):
            pass
    return {"source": ARCHIVES, "layout": "ILSVRC-2012 archives", "files": len(NAMES),
            "fingerprint": None, "problems": [],
            "bytes": sum((root / name).stat().st_size for name in NAMES.values())}


def _folder(root: Path, ruleset: rules.Ruleset,
            run_dir: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A folder's identity (walked once, its index saved in the run directory, or loaded
    from there when an earlier step saved it and no class folder changed since)."""
    if run_dir is None:
        found = scan(root)
        identity, note = {**found.summary(), "problems": problems(found, ruleset.dataset)}, {}
    else:
        shared = load_shared_index(run_dir, root, ruleset)
        try:
            if shared is None:
                shared = build_shared_index(root, run_dir, ruleset)
            identity = shared.identity
            note = {"dataset_index": "built" if shared.built else "loaded",
                    "dataset_scan_s": round(shared.scan_s, 3)}
        except DatasetIdentityError as exc:
            # A layout the identity reads but training cannot (a val class not in train/,
            # class folders without images): the identity says what it can; a local run's
            # replicas name the rest, a batch job is refused before it queues.
            found = scan(root)
            identity = {**found.summary(), "problems": problems(found, ruleset.dataset)}
            note = {"dataset_unusable": str(exc)}
    if ruleset.archive_proof:
        identity = {**identity, "problems": [folder_refusal(root, ruleset), *identity["problems"]]}
    return identity, note


def reprove(config: Config, rd: RunDir, store: Store, run_id: int,
            proving: Proving | None = None) -> dict[str, Any]:
    """A resumed session's proof of the archives (nothing the earlier sessions stored
    counts): the pass again, its index saved for this session's replicas, and the identity
    recorded in the store and system.json as ``data_sessions``. A run held to the rules whose
    archives are not the ones its first session proved is refused before its clock, naming
    the file. What its start-up records (empty for a run that reads no archives)."""
    root = _archives(config)
    if root is None:
        return {}
    run = store.run(run_id)
    system = dict(run["system"])
    ruleset = rules.get(system.get("ruleset"))
    found, identity = _proven(root, ruleset, proving, rd.path)
    first = (sessions(system) or [{}])[0].get("proof") or {}
    for part, then in (first.get("archives") or {}).items():
        now = identity["proof"]["archives"][part]["md5"]
        if then.get("md5") != now:
            identity["problems"].append(f"{root / NAMES[part]} {CHANGED} in the run's first "
                                        f"session (MD5 {then.get('md5')} then, {now} now)")
    if config.strict() and identity["problems"]:
        raise ConfigError("official run refused: this session's archives are not the ones the "
                          "run proved: " + "; ".join(identity["problems"]) + "; restore them, "
                          "or start a new run")
    system["data_sessions"] = [*system.get("data_sessions", []), identity]
    _record(store, rd, run_id, run, system)
    return {"dataset_index": "proven", "dataset_scan_s": round(found.seconds, 3),
            "data_proof_s": round(found.seconds, 3), "data_proof_mb_s": round(found.mb_per_s, 1)}


def _record(store: Store, rd: RunDir, run_id: int, run: dict[str, Any],
            system: dict[str, Any]) -> None:
    """The run's system record rewritten (store first: it is what check holds the file to)."""
    config = json.loads(json.dumps(run["config"]))
    store.extend_run(run_id, float(run["duration_s"]), config, system)
    write_atomic(rd.system, json.dumps(system, indent=1) + "\n")


def recheck(store: Store, rd: RunDir, run_id: int, config: Config) -> list[str]:
    """At the session's end: each archive it proved looked at again (one ``stat``). One that
    changed during the session is recorded with the session's proof (the result is then not
    valid, naming it); what changed, in words."""
    root = _archives(config)
    if root is None:
        return []
    run = store.run(run_id)
    system = dict(run["system"])
    known = sessions(system)
    if not known or known[-1].get("source") != ARCHIVES:
        return []
    proof = known[-1].get("proof") or {}
    changed = []
    for part, expected in archive_identities(proof).items():
        try:
            check_identity(root / NAMES[part], expected)
        except DatasetIdentityError as exc:
            changed.append(f"during the run: {exc}")
    if changed:
        proof = {**proof, "changed": [*proof.get("changed", []), *changed]}
        latest = {**known[-1], "proof": proof}
        if system.get("data_sessions"):
            system["data_sessions"] = [*system["data_sessions"][:-1], latest]
        else:
            system["dataset_identity"] = latest
        _record(store, rd, run_id, run, system)
    return changed

