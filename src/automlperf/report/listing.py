"""The results list, TOP500-style: run directories and submission bundles verified, sorted
into sections and ranked, as a terminal table, JSON, CSV and one self-contained HTML page.

Every entry is verified first (``check``, from the bundle alone), and its best accuracy is
re-measured from its weights (the regulated score rests on it, and no operation count can
confirm it): by the list itself where it has the validation set (the built-in datasets
always, ImageNet with ``data_dir``), else by a ``check --remeasure --record`` the bundle
carries, which is verified (:mod:`automlperf.submission.remeasure_record`) and shown, but never
ranks: a submitter can write one by hand. Only results that are official, valid, verified,
measured and re-measured by the list itself are ranked, like with like: only the rulesets
the list ranks (the current one unless told), within a ruleset and a duration class (its
duration exactly: a 10-hour run has more time to grow its models and never outranks a
1-hour one, nor does a 7,199-s one), and results closer than the score's own spread are
shown as equal rather than ordered. Official and valid ones whose accuracy this list did
not re-measure follow, unranked, saying why; then those of other rulesets; then measured
results that are unofficial or not valid; simulated ones apart; and entries that fail
verification (or cannot be read) last, each saying why. Within a section, by score. A run given twice
(its bundle and its directory) is one entry, the other source named beside it; another
version of a run already listed (the same run, a different result) is shown apart.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import io
import json
import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from automlperf import __version__, rules
from automlperf.config import Config
from automlperf.errors import UserError
from automlperf.submission.bundle import Source, opened, read_bundle_file
from automlperf.submission.mlperf import read_system_desc
from automlperf.submission.check import CheckOptions, CheckReport, check_source
from automlperf.submission.remeasure import RemeasureError
from automlperf.submission.remeasure_record import describe
from automlperf.measure.units import format_ops
from automlperf.report.compare import row
from automlperf.report.html import gather, render, render_records
from automlperf.store.records import ExportedRecords
from automlperf.store.rundir import write_atomic

SECTIONS = {
    "ranked": "Ranked: official, valid and verified results, accuracy re-measured",
    "unmeasured": "Not ranked: official, valid and verified, but this list did not re-measure "
                  "the accuracy from the weights (a submitter's own re-measurement is shown)",
    "other_ruleset": "Not ranked: official, valid and verified under a ruleset this list does "
                     "not rank",
    "unranked": "Not ranked: measured, verified, but unofficial or not valid",
    "simulated": "Simulated accelerators: not measurements, never ranked",
    "failed": "Failed verification, or another version of a listed run: shown apart, not "
              "ranked",
}
COLUMNS = ("section", "class", "rank", "system", "submitter", "name", "accelerators", "devices", "nodes",
           "score", "regulated_score", "ops_per_device", "fraction_of_ceiling", "ops_per_watt",
           "best_accuracy", "remeasured_accuracy", "remeasured_by", "elapsed_s", "date",
           "ruleset", "labels", "problems", "duplicates", "equal_to", "source", "report")
# Two scores closer than this share of the higher are shown as equal, not ordered: 2 x sqrt(2)
# standard deviations of the score of one machine, whose coefficient of variation measured
# 3.3-5.5 % (docs/official.md, "How far apart two results must be to differ"; about 10 %).
TIE_BAND = round(2 * math.sqrt(2) * 0.035, 2)
# Where a list re-measures an accuracy without being given the data: datasets automlperf
# ships. ImageNet (the official dataset) and CIFAR-10 need their folder.
NEEDS_DATA = ("imagenet", "cifar10")


@dataclass
class Remeasure:
    """How the list re-measures: the ImageNet validation set (``data_dir``) and the device
    (``device``, default the first GPU, else the CPU)."""

    data_dir: Path | None = None
    device: str | None = None


class ListError(UserError, ValueError):
    """What the list cannot be made of; the message says why."""


def _label_set(e: dict[str, Any]) -> list[str]:
    labels = ["official" if e["official"] else "unofficial",
              "valid" if e["valid"] else "not valid"]
    if e["simulated"]:
        labels.append("simulated")
    labels.append({True: "verified", False: "failed verification",
                   None: "not verified"}[e["verified"]])
    if e["verified"] and not e["simulated"]:
        labels.append({"list": "accuracy re-measured",
                       "record": "accuracy re-measured by its submitter"}.get(
                           e.get("remeasured_by") or "", "accuracy not re-measured"))
    return labels


def _section(e: dict[str, Any], rulesets: tuple[str, ...]) -> str:
    if e["verified"] is False or e.get("version_of"):
        return "failed"
    if e["simulated"]:
        return "simulated"
    if e["official"] and e["valid"] and e["verified"]:
        if (e.get("ruleset") or rules.LEGACY_ID) not in rulesets:
            return "other_ruleset"
        return "ranked" if e.get("remeasured_by") == "list" else "unmeasured"
    return "unranked"


def rank_class(e: dict[str, Any]) -> str:
    """What a ranked result is ranked among: its ruleset and its duration, whole hours as
    such and any other duration apart (a 7,199-s run never ranks with 1-hour ones: from
    aiperf-2021.4 only whole hours are valid)."""
    duration = float(e.get("duration_s") or 0)
    hours = duration / 3600
    length = f"{hours:g} h" if hours == int(hours) else f"{duration:,.0f} s"
    return f"{e.get('ruleset') or rules.LEGACY_ID}, {length}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "run"


def entry(path: Path, check: bool = True, reports: Path | None = None,
          number: int = 0, remeasure: Remeasure | None = None) -> dict[str, Any]:
    """One entry of the list: the recorded result of ``path`` (a run directory, a bundle
    folder or a bundle .tar.gz), verified and its accuracy re-measured unless ``check`` is
    off; its report is drawn into ``reports`` when given."""
    try:
        with opened(Path(path)) as source:
            problems: list[str] = []
            verified = None
            again: dict[str, Any] = {"remeasured_accuracy": None, "remeasured_by": None,
                                     "remeasured_how": None}
            if check:
                checked, why = _verify(source, remeasure or Remeasure())
                verified, problems = checked.ok, checked.mismatches
                again = _remeasured(checked, why)
            described = read_bundle_file(source.root) if source.bundle else {}
            desc = read_system_desc(source.root)
            e = row(source.root)
            identity = _identity(source, e)
            link = None
            if reports is not None and verified is not False:
                target = reports / f"{number:03d}-{_slug(e.get('name') or Path(path).name)}.html"
                link, no_report = _report(source, target)
                if no_report:
                    problems = [*problems, no_report]
    except (UserError, OSError, ValueError) as exc:
        return _unreadable(path, str(exc))
    host = e.pop("system")
    e.update(source=str(path), verified=verified, problems=problems, report=link,
             submitter=described.get("submitter") or desc.get("submitter"), host=host,
             system=described.get("system_name") or desc.get("system_name") or host,
             duplicates=[], bundle=source.bundle, **again, **identity)
    started = e.get("started_at")
    e["date"] = (datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
                 .strftime("%Y-%m-%d") if isinstance(started, (int, float)) else None)
    e["labels"] = _label_set(e)
    if e["verified"] and not e["simulated"] and e["remeasured_by"] != "list" and \
            e["official"] and e["valid"]:
        why = again["remeasured_how"]
        if e["remeasured_by"] == "record":
            why = (f"only its submitter re-measured the accuracy ({why}); the list ranks what "
                   "it re-measures itself: give it the validation set (--data-dir)")
        e["problems"] = [*e["problems"], f"not ranked: {why}"]
    return e


def _verify(source: Source, how: Remeasure) -> tuple[CheckReport, str | None]:
    """``check`` of ``source``, re-measuring its best accuracy where the list has the data;
    also why it was not re-measured here (None when it was)."""
    plain = CheckOptions(device=how.device)
    try:
        config = Config.load(source.root / "config.toml")
    except (UserError, OSError, ValueError):
        return check_source(source, plain), "its configuration cannot be read"
    dataset = config.data.dataset
    simulated = config.simulated
    if simulated or dataset == "synthetic":
        return check_source(source, plain), "no model was trained on real data"
    data_dir = None
    if dataset in NEEDS_DATA:
        if dataset != "imagenet" or how.data_dir is None:
            return check_source(source, plain), (
                f"the {dataset} validation set was not given to the list (--data-dir), and no "
                "verified re-measurement travels with the entry (a bundle keeps one: "
                "`automlperf check --remeasure --record BUNDLE` where the data is)")
        data_dir = how.data_dir
    try:
        return check_source(source, CheckOptions(data_dir=data_dir, remeasure=True,
                                                 device=how.device)), None
    except RemeasureError as exc:
        return check_source(source, plain), f"it cannot be re-measured here: {exc}"


def _remeasured(checked: CheckReport, why: str | None) -> dict[str, Any]:
    """The accuracy re-measured from the weights (by this list, else by a verified record
    the bundle carries), by whom, and how or why not."""
    again = checked.remeasurement
    if again is not None:
        return {"remeasured_accuracy": again.measured, "remeasured_by": "list",
                "remeasured_how": f"re-measured by this list on {again.device} "
                                  f"({again.images:,} images, {again.precision})"}
    if checked.recorded is not None:
        return {"remeasured_accuracy": checked.recorded["measured"],
                "remeasured_by": "record",
                "remeasured_how": f"re-measured by check --remeasure --record, "
                                  f"{describe(checked.recorded)}"}
    return {"remeasured_accuracy": None, "remeasured_by": None,
            "remeasured_how": f"the accuracy was not re-measured from the weights: {why}"}


def _identity(source: Source, e: dict[str, Any]) -> dict[str, Any]:
    """What makes two sources one run (its id, name and start in its store) and one result
    (the SHA-256 of its result.json)."""
    meta = json.loads((source.root / "run.json").read_text()) \
        if (source.root / "run.json").exists() else {}
    run = [meta.get("run_id"), meta.get("name"), e.get("started_at")]
    content = hashlib.sha256((source.root / "result.json").read_bytes()).hexdigest()
    return {"run_key": run, "content": content}


def _report(source: Source, target: Path) -> tuple[str | None, str | None]:
    """The entry's report, drawn here from its verified records rather than copied from the
    site: a page the list publishes holds nothing a submitter wrote but the records' text
    (escaped). Returns its link beside the page, or why there is none."""
    try:
        if source.bundle:
            html = render_records(source.root, ExportedRecords(source.root))
        else:
            html = render(gather(source.root))
    except (UserError, OSError, ValueError, KeyError) as exc:
        return None, f"no report: it could not be drawn from the records ({exc})"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, html)
    return f"{target.parent.name}/{target.name}", None


def _unreadable(path: Path, why: str) -> dict[str, Any]:
    e: dict[str, Any] = {name: None for name in COLUMNS}
    e.update(source=str(path), name=Path(path).name, system=Path(path).name, official=False,
             valid=False, simulated=False, verified=False, problems=[why], score=None,
             labels=["failed verification"], duplicates=[])
    return e


def listing(paths: list[Path], check: bool = True, reports: Path | None = None,
            progress: Callable[[Path, dict[str, Any]], None] | None = None,
            remeasure: Remeasure | None = None,
            rulesets: tuple[str, ...] = (rules.CURRENT.id,)) -> list[dict[str, Any]]:
    """The entries of ``paths``, in list order: section by section, by score, the ranked
    ones numbered; one entry per run."""
    if not paths:
        raise ListError("give at least one run directory or bundle to list")
    entries = []
    for number, path in enumerate(paths, start=1):
        e = entry(path, check, reports, number, remeasure)
        entries.append(e)
        if progress is not None:
            progress(path, e)
    return ranked(once_per_run(entries, reports), rulesets)


def _preference(e: dict[str, Any]) -> tuple[bool, int, bool]:
    """Which source of a run stands for it: verified, then re-measured (by the list first),
    then a bundle (what lists are made of) over a run directory."""
    return (e.get("verified") is not True,
            {"list": 0, "record": 1}.get(e.get("remeasured_by") or "", 2),
            not e.get("bundle"))


def once_per_run(entries: list[dict[str, Any]],
                 reports: Path | None = None) -> list[dict[str, Any]]:
    """One entry per run: a run given again with the same result (its bundle and its
    directory) is dropped, its source named in ``duplicates`` of the one kept; a run given
    again with another result is kept apart (``version_of``), never ranked beside it."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        key = json.dumps(e.get("run_key"))
        if e.get("run_key") is None or None in (e.get("run_key") or [None])[:2]:
            key = f"unreadable:{e['source']}"
        groups.setdefault(key, []).append(e)
    kept: list[dict[str, Any]] = []
    for members in groups.values():
        members = sorted(members, key=lambda m: (_preference(m), members.index(m)))
        first = members[0]
        kept.append(first)
        for other in members[1:]:
            if other.get("content") == first.get("content"):
                first["duplicates"] = [*first.get("duplicates", []), other["source"]]
                if reports is not None and other.get("report"):
                    (reports.parent / other["report"]).unlink(missing_ok=True)
                continue
            run_id, name, _ = first["run_key"]
            other["version_of"] = first["source"]
            other["problems"] = [*other["problems"], (
                f"another version of run {run_id} ({name!r}), listed as {first['source']}: "
                "the same run with a different result.json; a run is listed once")]
            kept.append(other)
    return kept


def ranked(entries: list[dict[str, Any]],
           rulesets: tuple[str, ...] = (rules.CURRENT.id,)) -> list[dict[str, Any]]:
    """``entries`` (with their labels) sectioned, ordered by score within each section (the
    ranked ones by class first), and the ranked ones numbered from 1 within their class:
    only results of ``rulesets`` are ranked (a result whose ruleset was changed to an older
    one never ranks beside current ones). Within a class an entry's rank is one more than
    the entries ahead of it by more than the score's spread (:data:`TIE_BAND`); those within
    it are named in ``equal_to``, and share a rank where none is further ahead."""
    order = list(SECTIONS)
    for e in entries:
        e["section"] = _section(e, rulesets)
        e["class"] = rank_class(e) if e["section"] == "ranked" else None
        e["equal_to"] = []
        if e["section"] == "other_ruleset":
            e["problems"] = [*e.get("problems", []), (
                f"not ranked: ruleset {e.get('ruleset') or rules.LEGACY_ID}; this list ranks "
                f"{', '.join(rulesets)} (`automlperf list --ruleset ID` ranks others, each in "
                "its own classes)")]
    entries = sorted(entries, key=lambda e: (order.index(e["section"]), e["class"] or "",
                                             -(e["score"] or 0.0), e["source"]))
    for e in entries:
        e["rank"] = None
        if e["section"] != "ranked":
            continue
        mine = [o for o in entries if o["section"] == "ranked" and o["class"] == e["class"]
                and o is not e]
        score = e["score"] or 0.0
        e["rank"] = 1 + sum(1 for o in mine if apart(o["score"] or 0.0, score) and
                            (o["score"] or 0.0) > score)
        e["equal_to"] = [f"{o['system']} ({o['source']})" for o in mine
                         if not apart(o["score"] or 0.0, score)]
    return entries


def apart(a: float, b: float) -> bool:
    """Whether two scores differ by more than the score's own spread."""
    return abs(a - b) > TIE_BAND * max(a, b)


def to_json(entries: list[dict[str, Any]]) -> str:
    return json.dumps({"automlperf_version": __version__, "sections": SECTIONS,
                       "entries": entries}, indent=1) + "\n"


def to_csv(entries: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for e in entries:
        writer.writerow(["; ".join(e.get(c) or []) if c in ("labels", "problems", "duplicates",
                                                             "equal_to")
                         else e.get(c) for c in COLUMNS])
    return out.getvalue()


_env = jinja2.Environment(loader=jinja2.PackageLoader("automlperf.report", "templates"),
                          autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                          lstrip_blocks=True)
# -0.0 (the regulated score at no accuracy) reads as 0.
_env.filters["ops"] = lambda v: format_ops(None if v is None else v + 0.0)


def write_page(entries: list[dict[str, Any]], path: Path, title: str = "automlperf results") -> Path:
    """The list as one self-contained HTML page (no network): sortable, filterable, readable
    on a phone; each entry links to its report (in the folder beside the page)."""
    html = _env.get_template("list.html.j2").render(
        entries=entries, sections=SECTIONS, title=title, version=__version__, tie_band=TIE_BAND,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    write_atomic(Path(path), html)
    return Path(path)


def reports_folder(page: Path) -> Path:
    """Where the entries' reports go: beside the page, named after it."""
    return page.with_name(f"{page.stem}-reports")


def publish(paths: list[Path], html: Path | None = None, check: bool = True,
            progress: Callable[[Path, dict[str, Any]], None] | None = None,
            title: str = "automlperf results",
            remeasure: Remeasure | None = None,
            rulesets: tuple[str, ...] = (rules.CURRENT.id,)) -> list[dict[str, Any]]:
    """Verify and list ``paths`` (re-measuring as ``remeasure`` allows, ranking results of
    ``rulesets``); with ``html``, write the page and the reports beside it."""
    for ruleset in rulesets:
        rules.get(ruleset)  # an unknown id is refused before anything is verified
    reports = reports_folder(html) if html is not None else None
    if reports is not None and reports.exists():
        shutil.rmtree(reports)
    entries = listing(paths, check, reports, progress, remeasure, rulesets)
    if html is not None:
        write_page(entries, html, title)
    return entries
