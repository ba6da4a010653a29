"""result.json and system.json held against a fresh computation and the run's own records.

What ``automlperf check`` compares here, once the store and the logs agree:
* every figure result.json gives, and a results list shows (score, regulated score,
  accuracy, totals, timeline, validity, violations, devices, nodes, replicas, operations per
  device, accelerators, energy, the run's name and date), with the same figures computed
  afresh from the store under the ruleset the run was started with, whichever it is;
* the ruleset: the store's is the one its records were written under
  (:mod:`automlperf.submission.ruleset_check`), and result.json names the same one, so that
  deleting or changing the key switches nothing off;
* system.json with the system description the run recorded in its store when it was
  created (host, CPU, accelerators, provenance, dataset identity);
* the dataset identity, provenance, node descriptions and time breakdown with the store's;
* the data: a run on the official archives has every session's recorded MD5s equal to the
  ruleset's published ones where it claims to be official, and, given the list keeper's own
  archives (``data_dir``), their MD5s computed here equal to the recorded ones; a folder,
  when reachable, has the fingerprint recorded at the start (it is rescanned). Nothing is
  sampled: the proof is each session's own computation (automlperf.dataset.proof).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from automlperf import rules
from automlperf.config import Config
from automlperf.dataset.archive import NAMES, is_archive_folder, md5_of
from automlperf.dataset.folder import scan
from automlperf.dataset.index import ARCHIVES, DatasetIdentityError
from automlperf.dataset.proof import sessions
from automlperf.measure.breakdown import ADDED_PARTS, PARTS
from automlperf.measure.provenance import digest
from automlperf.store.rundir import RunDir
from automlperf.submission.ruleset_check import ruleset_problems

COMPARED = ("score", "regulated_score", "best_accuracy", "error", "total_ops", "elapsed_s",
            "epochs", "train_images", "val_images", "unreadable_images", "best_trial",
            "official", "valid", "trials", "peak_ops", "fraction_of_peak", "ceiling_ops",
            "fraction_of_ceiling", "energy_j", "ops_per_watt", "decoding", "charging")
# Results of a ruleset before aiperf-2021.3 may lack these: versions that wrote them did not
# have them yet.
ADDED_LATER = ("peak_ops", "ceiling_ops", "fraction_of_ceiling", "unreadable_images",
               "decoding", "charging")
# What a results list shows beside the score, under every ruleset: every version wrote
# these (its name and date included) ...
LISTED = ("name", "started_at", "replicas", "devices", "nodes", "ops_per_s_per_device",
          "trial_status", "dataset", "duration_s")
# ... and these from the first version that measured energy (compared where present in the
# results of rulesets before aiperf-2021.3).
LISTED_LATER = ("mean_power_w", "gpu_energy_j", "cpu_energy_j")
LEGACY_RULESETS = ("aiperf-2021.1", "aiperf-2021.2")
# Recorded wholesale; compared by digest, named when they differ.
RECORDS = ("dataset_identity", "provenance", "node_descriptions")


def same(a: Any, b: Any) -> bool:
    """Equal, floats to a relative 1e-9."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def check_result(rd: RunDir, config: Config, fresh: dict[str, Any], stored: dict[str, Any],
                 bad: list[str], data_dir: Path | None = None) -> None:
    """result.json and system.json against ``fresh`` (the result computed again) and
    ``stored`` (the system description the run recorded in its store)."""
    if not rd.result.exists():
        bad.append(f"{rd.result} is missing")
        return
    try:
        recorded = json.loads(rd.result.read_text())
    except json.JSONDecodeError as exc:
        bad.append(f"{rd.result} is not valid JSON: {exc}")
        return
    # A run created before stores recorded a ruleset names none, and holds none of what was
    # recorded beside it; any other that names none had the key deleted.
    era = ruleset_problems(stored, recorded, fresh["node_descriptions"])
    bad.extend(era)
    if ("ruleset" in stored or "ruleset" in recorded) and not era:
        _check_ruleset(recorded, fresh, bad)  # a list shows result.json's
    if "ruleset" in stored or era:
        _check_records(recorded, fresh, bad)
        _check_data(config, fresh, bad, data_dir, stored)
    _check_system_file(rd, stored, bad)
    legacy = fresh["ruleset"] in LEGACY_RULESETS
    for name in COMPARED + LISTED + LISTED_LATER:
        if name not in recorded and legacy and name in ADDED_LATER + LISTED_LATER:
            continue
        if not same(recorded.get(name), fresh.get(name)):
            shown = "missing" if name not in recorded else repr(recorded[name])
            bad.append(f"result.json: {name} is {shown}, recomputed {fresh.get(name)!r}")
    _check_system_figure(recorded, fresh, stored, legacy, bad)
    # A result without the label predates simulated runs: it is a measured one.
    if bool(recorded.get("simulated")) != fresh["simulated"] or \
            recorded.get("simulation") != fresh["simulation"]:
        bad.append(f"result.json: simulated is {recorded.get('simulated')!r} "
                   f"({recorded.get('simulation')!r}), but the run's configuration makes it "
                   f"{fresh['simulated']!r} ({fresh['simulation']!r})")
    if sorted(v["rule"] for v in recorded.get("violations", [])) != \
            sorted(v["rule"] for v in fresh["violations"]):
        bad.append("result.json: violations "
                   f"{sorted(v['rule'] for v in recorded.get('violations', []))} differ from the "
                   f"recomputed {sorted(v['rule'] for v in fresh['violations'])}")
    marks, fresh_marks = recorded.get("timeline", []), fresh["timeline"]
    if len(marks) != len(fresh_marks):
        bad.append(f"result.json: timeline has {len(marks)} marks, recomputed {len(fresh_marks)}")
    else:
        for a, b in zip(marks, fresh_marks):
            for name in ("hours", "ops", "ops_per_s", "best_accuracy", "regulated"):
                if not same(a.get(name), b.get(name)):
                    bad.append(f"result.json: timeline at {b['hours']} h: {name} is "
                               f"{a.get(name)!r}, recomputed {b.get(name)!r}")


def _check_system_figure(recorded: dict[str, Any], fresh: dict[str, Any],
                         stored: dict[str, Any], legacy: bool, bad: list[str]) -> None:
    """The system a list shows (host, CPU, accelerators) is the one the records describe.
    Results of rulesets before aiperf-2021.3 took the host and CPU from the primary of
    their last session, which a resumed run may have started elsewhere, and added its
    accelerators: there each must be one the records describe (the store's system or a
    node's), and every accelerator the nodes describe must be named."""
    mine, theirs = recorded.get("system"), fresh.get("system") or {}
    if not legacy or not isinstance(mine, dict):
        if not same(mine, theirs):
            shown = "missing" if mine is None else repr(mine)
            bad.append(f"result.json: system is {shown}, recomputed {theirs!r}")
        return
    nodes = fresh.get("node_descriptions") or []
    systems = [stored, *(n.get("system") or {} for n in nodes)]
    hosts = {stored.get("host"), *(n.get("host") for n in nodes)}
    cpus = {(s.get("cpu") or {}).get("model") for s in systems}
    known = {a.get("name") for s in systems for a in s.get("accelerators", [])}
    named = set(mine.get("accelerators") or [])
    on_nodes = {a.get("name") for n in nodes for a in (n.get("system") or {}).get("accelerators", [])}
    if mine.get("host") not in hosts or mine.get("cpu") not in cpus or not named <= known \
            or not on_nodes <= named:
        bad.append(f"result.json: system is {mine!r}, but the records describe "
                   f"{sorted(filter(None, hosts))} with {sorted(filter(None, known)) or 'no accelerators'}")


def _check_ruleset(recorded: dict[str, Any], fresh: dict[str, Any], bad: list[str]) -> None:
    if "ruleset" not in recorded:
        bad.append(f"result.json: ruleset is missing, but the run was started under "
                   f"{fresh['ruleset']!r}")
        return
    try:
        rules.get(recorded["ruleset"])
    except rules.UnknownRuleset as exc:
        bad.append(f"result.json: {exc}")
    if recorded["ruleset"] != fresh["ruleset"]:
        bad.append(f"result.json: ruleset is {recorded['ruleset']!r}, but the run was "
                   f"started under {fresh['ruleset']!r}")


def _check_system_file(rd: RunDir, stored: dict[str, Any], bad: list[str]) -> None:
    """system.json is the description the run recorded in its store when it was created."""
    try:
        on_disk = json.loads(rd.system.read_text()) if rd.system.exists() else {}
    except json.JSONDecodeError as exc:
        bad.append(f"{rd.system} is not valid JSON: {exc}")
        return
    if digest(on_disk) == digest(stored):
        return
    keys = sorted(k for k in set(on_disk) | set(stored)
                  if digest(on_disk.get(k)) != digest(stored.get(k)))
    bad.append(f"{rd.system} differs from the system the run recorded in its store "
               f"({', '.join(keys[:6])})")


def _check_records(recorded: dict[str, Any], fresh: dict[str, Any], bad: list[str]) -> None:
    """The dataset identity, provenance, node descriptions and time breakdown in
    result.json equal what the run recorded in its store."""
    for name in RECORDS:
        mine, theirs = recorded.get(name), fresh.get(name)
        if digest(mine) == digest(theirs):
            continue
        keys = sorted(k for k in set(mine or {}) | set(theirs or {})
                      if (mine or {}).get(k) != (theirs or {}).get(k)) \
            if isinstance(mine, dict) and isinstance(theirs, dict) else []
        where = f" ({', '.join(keys[:5])})" if keys else ""
        bad.append(f"result.json: {name} differs from what the run recorded{where}")
    mine_b, theirs_b = recorded.get("time_breakdown") or {}, fresh["time_breakdown"]
    for label, a, b in [("total", mine_b.get("total", {}), theirs_b["total"])] + [
            (f"replica {r.get('replica')}", r, f) for r, f in
            zip(mine_b.get("replicas", []), theirs_b["replicas"], strict=False)]:
        for part in (*PARTS, "session_s"):
            if part in ADDED_PARTS and part not in a:
                continue  # a result.json written before the part was
            if not same(a.get(part), b.get(part)):
                bad.append(f"result.json: time_breakdown {label} {part} is {a.get(part)!r}, "
                           f"recomputed {b.get(part)!r}")
    if len(mine_b.get("replicas", [])) != len(theirs_b["replicas"]):
        bad.append("result.json: time_breakdown lists a different number of replicas")


def _check_data(config: Config, fresh: dict[str, Any], bad: list[str],
                data_dir: Path | None = None, system: dict[str, Any] | None = None) -> None:
    """The run's data: the official archives' recorded MD5s (and the keeper's own archives
    when ``data_dir`` holds them), or a folder rescanned when it is reachable (``data_dir``,
    else the run's): it must be the data the run used."""
    identity = fresh.get("dataset_identity")
    if not identity:
        return
    if identity.get("source") == ARCHIVES:
        _check_archives(fresh, bad, data_dir, system or {"dataset_identity": identity})
        return
    folder = data_dir if data_dir is not None else config.data.data_dir
    if folder is None or not Path(folder).is_dir() or is_archive_folder(folder):
        return
    try:
        now = scan(folder).fingerprint
    except (DatasetIdentityError, OSError) as exc:
        # A folder the run itself could not read (it recorded no fingerprint) is the same.
        if identity.get("fingerprint") is not None:
            bad.append(f"{folder}: cannot rescan the data ({exc})")
        return
    if now != identity.get("fingerprint"):
        bad.append(f"{folder}: the data's fingerprint is now {now}, but the run recorded "
                   f"{identity.get('fingerprint')} (files were added, removed, renamed or "
                   "changed)")


# The MD5s of archives read by this process, by path and identity: a list keeper's archives
# are read once for all the entries of a list.
_md5s: dict[tuple[str, tuple[int, ...]], str] = {}


def _keeper_md5(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    if key not in _md5s:
        _md5s[key] = md5_of(path)[0]
    return _md5s[key]


def _check_archives(fresh: dict[str, Any], bad: list[str], data_dir: Path | None,
                    system: dict[str, Any]) -> None:
    """Every session's recorded MD5s are the ruleset's published ones where the result is
    official, and the archives in ``data_dir`` (the keeper's), read here, are the ones every
    session recorded."""
    ruleset = rules.get(fresh.get("ruleset"))
    published = {part: md5 for part, (_, md5) in ruleset.dataset.archives.items()}
    recorded = [s for s in sessions(system) if s.get("source") == ARCHIVES]
    if fresh.get("official") and ruleset.archive_proof:
        for number, s in enumerate(recorded, start=1):
            proof = s.get("proof") or {}
            for part, md5 in published.items():
                got = (proof.get("archives", {}).get(part) or {}).get("md5")
                if got != md5:
                    bad.append(f"session {number} recorded {NAMES[part]} with MD5 {got}, and "
                               f"ruleset {ruleset.id} publishes {md5}: not official")
    if data_dir is None or not is_archive_folder(data_dir):
        return
    for part, name in NAMES.items():
        path = Path(data_dir) / name
        if not path.is_file():
            continue  # a keeper may hold the validation archive and the devkit only
        try:
            mine = _keeper_md5(path)
        except (OSError, DatasetIdentityError) as exc:
            bad.append(f"{path}: cannot be read ({exc})")
            continue
        for number, s in enumerate(recorded, start=1):
            got = ((s.get("proof") or {}).get("archives", {}).get(part) or {}).get("md5")
            if got != mine:
                bad.append(f"{path} has MD5 {mine}, but session {number} of the run recorded "
                           f"{got} for its {name}: not the same archive")
