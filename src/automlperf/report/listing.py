"""The results list, TOP500-style: run directories and submission bundles verified, sorted
into sections and ranked, as a terminal table, JSON, CSV and one self-contained HTML page.

Every entry is verified first (``check``, from the bundle alone). Only results that are
official, valid, verified and measured are ranked; measured results that are unofficial or
not valid come after them, unranked; simulated ones apart; and entries that fail
verification (or cannot be read) last, each saying why. Within a section, by score.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

from automlperf import __version__
from automlperf.errors import UserError
from automlperf.measure.bundle import Source, opened, read_bundle_file
from automlperf.measure.mlperf import read_system_desc
from automlperf.measure.check import CheckOptions, check_source
from automlperf.measure.units import format_ops
from automlperf.report.compare import row
from automlperf.report.html import gather, render, render_records
from automlperf.store.records import ExportedRecords
from automlperf.store.rundir import write_atomic

SECTIONS = {
    "ranked": "Ranked: official, valid and verified results",
    "unranked": "Not ranked: measured, verified, but unofficial or not valid",
    "simulated": "Simulated accelerators: not measurements, never ranked",
    "failed": "Failed verification: shown apart, not ranked",
}
COLUMNS = ("section", "rank", "system", "submitter", "name", "accelerators", "devices", "nodes",
           "score", "regulated_score", "ops_per_device", "fraction_of_ceiling", "ops_per_watt",
           "best_accuracy", "elapsed_s", "date", "ruleset", "labels", "problems", "source",
           "report")


class ListError(UserError, ValueError):
    """What the list cannot be made of; the message says why."""


def _label_set(e: dict[str, Any]) -> list[str]:
    labels = ["official" if e["official"] else "unofficial",
              "valid" if e["valid"] else "not valid"]
    if e["simulated"]:
        labels.append("simulated")
    labels.append({True: "verified", False: "failed verification",
                   None: "not verified"}[e["verified"]])
    return labels


def _section(e: dict[str, Any]) -> str:
    if e["verified"] is False:
        return "failed"
    if e["simulated"]:
        return "simulated"
    if e["official"] and e["valid"] and e["verified"]:
        return "ranked"
    return "unranked"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "run"


def entry(path: Path, check: bool = True, reports: Path | None = None,
          number: int = 0) -> dict[str, Any]:
    """One entry of the list: the recorded result of ``path`` (a run directory, a bundle
    folder or a bundle .tar.gz), verified unless ``check`` is off; its report is drawn into
    ``reports`` when given."""
    try:
        with opened(Path(path)) as source:
            problems: list[str] = []
            verified = None
            if check:
                checked = check_source(source, CheckOptions())
                verified, problems = checked.ok, checked.mismatches
            described = read_bundle_file(source.root) if source.bundle else {}
            desc = read_system_desc(source.root)
            e = row(source.root)
            link = None
            if reports is not None and verified is not False:
                target = reports / f"{number:03d}-{_slug(e.get('name') or Path(path).name)}.html"
                link, why = _report(source, target)
                if why:
                    problems = [*problems, why]
    except (UserError, OSError, ValueError) as exc:
        return _unreadable(path, str(exc))
    host = e.pop("system")
    e.update(source=str(path), verified=verified, problems=problems, report=link,
             submitter=described.get("submitter") or desc.get("submitter"), host=host,
             system=described.get("system_name") or desc.get("system_name") or host)
    started = e.get("started_at")
    e["date"] = (datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
                 .strftime("%Y-%m-%d") if isinstance(started, (int, float)) else None)
    e["labels"] = _label_set(e)
    return e


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
             labels=["failed verification"])
    return e


def listing(paths: list[Path], check: bool = True, reports: Path | None = None,
            progress: Callable[[Path, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """The entries of ``paths``, in list order: section by section, by score, the ranked
    ones numbered."""
    if not paths:
        raise ListError("give at least one run directory or bundle to list")
    entries = []
    for number, path in enumerate(paths, start=1):
        e = entry(path, check, reports, number)
        entries.append(e)
        if progress is not None:
            progress(path, e)
    return ranked(entries)


def ranked(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` (with their labels) sectioned, ordered by score within each section, and
    the ranked ones numbered from 1."""
    order = list(SECTIONS)
    for e in entries:
        e["section"] = _section(e)
    entries = sorted(entries, key=lambda e: (order.index(e["section"]), -(e["score"] or 0.0),
                                             e["source"]))
    rank = 0
    for e in entries:
        e["rank"] = None
        if e["section"] == "ranked":
            rank += 1
            e["rank"] = rank
    return entries


def to_json(entries: list[dict[str, Any]]) -> str:
    return json.dumps({"automlperf_version": __version__, "sections": SECTIONS,
                       "entries": entries}, indent=1) + "\n"


def to_csv(entries: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for e in entries:
        writer.writerow(["; ".join(e.get(c) or []) if c in ("labels", "problems") else e.get(c)
                         for c in COLUMNS])
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
        entries=entries, sections=SECTIONS, title=title, version=__version__,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    write_atomic(Path(path), html)
    return Path(path)


def reports_folder(page: Path) -> Path:
    """Where the entries' reports go: beside the page, named after it."""
    return page.with_name(f"{page.stem}-reports")


def publish(paths: list[Path], html: Path | None = None, check: bool = True,
            progress: Callable[[Path, dict[str, Any]], None] | None = None,
            title: str = "automlperf results") -> list[dict[str, Any]]:
    """Verify and list ``paths``; with ``html``, write the page and the reports beside it."""
    reports = reports_folder(html) if html is not None else None
    if reports is not None and reports.exists():
        shutil.rmtree(reports)
    entries = listing(paths, check, reports, progress)
    if html is not None:
        write_page(entries, html, title)
    return entries
