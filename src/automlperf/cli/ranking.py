"""Commands over several results: the verified results list and the ranking of runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from automlperf import rules
from automlperf.cli.common import app, err, out, styled, user_errors


@app.command("list")
@user_errors
def list_results(
    entries: Annotated[list[Path], typer.Argument(help="Bundles (.tar.gz or folders) and run "
                                                  "directories.")],
    html: Annotated[Optional[Path], typer.Option(help="Write the list as one HTML page (its "
                                                 "entries' reports in PAGE-reports/ beside "
                                                 "it).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the entries as "
                                                     "JSON (- for standard output).")] = None,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="Write the entries as CSV "
                                                    "(- for standard output).")] = None,
    title: Annotated[str, typer.Option(help="The page's title.")] = "automlperf results",
    verify: Annotated[bool, typer.Option(help="Verify every entry first (--no-verify lists "
                                         "them unverified, unranked).")] = True,
    data_dir: Annotated[Optional[Path], typer.Option(help="The ImageNet folder: re-measure the "
                                                     "best accuracy of every entry on ImageNet "
                                                     "from its weights (entries on the "
                                                     "built-in datasets always are).")] = None,
    device: Annotated[Optional[str], typer.Option(help="Where accuracies are re-measured, "
                                                  "e.g. cuda:0 or cpu (default: the first "
                                                  "GPU, else the CPU).")] = None,
    ruleset: Annotated[Optional[list[str]], typer.Option(
        help="Rank results of this ruleset (repeat for several, each ranked in its own "
             "classes); default: the current one. Others are listed, unranked.")] = None,
) -> None:
    """The results list, TOP500-style: every entry verified and its best accuracy re-measured
    from its weights (here, or by a recorded `check --remeasure --record`); official valid
    results re-measured are ranked by score, the others shown apart with why."""
    from automlperf.measure.units import format_ops
    from automlperf.report.listing import SECTIONS, Remeasure, publish, to_csv, to_json

    def progress(path: Path, entry: dict[str, Any]) -> None:
        err.print(f"{path}: {', '.join(entry['labels'])}", highlight=False)

    rows = publish(entries, html, verify, progress, title, Remeasure(data_dir, device),
                   tuple(ruleset or (rules.CURRENT.id,)))
    for target, text in ((json_out, to_json), (csv_out, to_csv)):
        if target is not None:
            if str(target) == "-":
                print(text(rows), end="")
            else:
                target.write_text(text(rows))
                err.print(f"written: {target}", highlight=False)
    if html is not None:
        err.print(f"page: {html}", highlight=False)
    if str(json_out) == "-" or str(csv_out) == "-":
        return
    for key, heading in SECTIONS.items():
        mine = [r for r in rows if r["section"] == key]
        if not mine:
            continue
        table = Table(title=heading)
        for col in ("#", "system", "accelerators", "devices", "nodes", "score", "regulated",
                    "per device", "best acc.", "re-measured", "labels"):
            table.add_column(col, justify="right" if col in ("#", "devices", "nodes") else "left")
        for r in mine:
            table.add_row("-" if r["rank"] is None else f"{r['rank']}{'=' if r['equal_to'] else ''}",
                          str(r["system"]),
                          str(r["accelerators"] or "-"), str(r["devices"] or "-"),
                          str(r["nodes"] or "-"), format_ops(r["score"]),
                          format_ops(r["regulated_score"]), format_ops(r["ops_per_device"]),
                          _accuracy(r.get("best_accuracy")), _remeasured(r),
                          ", ".join(r["labels"]))
        out.print(table)
        # Beneath the table, whole: a path or a reason squeezed into a column is unreadable.
        for r in mine:
            who = f"{r['rank'] or '-'} {r['system']}"
            for problem in r["problems"][:3]:
                out.print(styled(f"  {who}: ", (problem, "red")), highlight=False)
            for d in r.get("duplicates") or []:
                out.print(f"  {who}: also given as {d} (the same run, listed once)",
                          highlight=False)


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _remeasured(r: dict[str, Any]) -> str:
    """The re-measured accuracy and by whom: this list, or a record the bundle carries."""
    if r.get("remeasured_accuracy") is None:
        return "-"
    return f"{r['remeasured_accuracy']:.4f} ({r['remeasured_by']})"


def _scaling(run_dirs: list[Path], html: Path, as_json: bool) -> None:
    from automlperf.measure.units import format_ops
    from automlperf.report.scaling import scaling

    rows, page = scaling(run_dirs, html)
    if as_json:
        print(json.dumps({"runs": rows, "html": str(page)}, indent=1))
        return
    simulated = rows[0]["simulated"]
    table = Table(title="automlperf weak scaling" + (" (SIMULATED)" if simulated else ""))
    for col in ("run", "devices", "nodes", "score", "per device", "efficiency"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in rows:
        table.add_row(r["name"] or r["run"], str(r["devices"]), str(r["nodes"]),
                      format_ops(r["score"]), format_ops(r["ops_per_device"]),
                      f"{r['efficiency']:.4f}")
    out.print(table)
    if simulated:
        out.print("SIMULATED: the devices were modelled; these figures are not measurements.",
                  style="bold red", highlight=False)
    out.print(f"page: {page}", highlight=False)


def verdict(row: dict[str, Any]) -> str:
    """The validity column of a ranking row."""
    if row.get("simulated"):
        return "no (SIMULATED)"
    return "yes" if row["valid"] else ("no" if row["official"] else "no (unofficial)")


@app.command()
@user_errors
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories to rank.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
    scaling: Annotated[bool, typer.Option("--scaling", help="Weak scaling instead of a "
                                          "ranking: OPS per device of each run relative to "
                                          "the smallest, as a table and an HTML page.")] = False,
    html: Annotated[Path, typer.Option(help="Where --scaling writes its page.")] =
        Path("scaling.html"),
) -> None:
    """Rank several runs: system, accelerators, score, regulated score, OPS per device and
    per watt, energy. With --scaling: their weak-scaling efficiency (AIPerf's Fig. 6)."""
    from automlperf.measure.units import format_energy, format_ops
    from automlperf.report.compare import ranking

    if scaling:
        _scaling(run_dirs, html, as_json)
        return
    rows = ranking(run_dirs)
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title="automlperf ranking")
    for col in ("#", "run", "system", "accelerators", "devices", "score", "regulated",
                "per device", "of peak", "per watt", "energy", "best acc.", "valid"):
        table.add_column(col, justify="right" if col in ("#", "devices") else "left")
    for r in rows:
        table.add_row(str(r["rank"]), r["name"] or r["run"], r["system"], r["accelerators"],
                      str(r["devices"]), format_ops(r["score"]), format_ops(r["regulated_score"]),
                      format_ops(r["ops_per_device"]),
                      "-" if r["fraction_of_peak"] is None else f"{100 * r['fraction_of_peak']:.1f} %",
                      "-" if r["ops_per_watt"] is None else f"{format_ops(r['ops_per_watt'])}/W",
                      format_energy(r["energy_j"]),
                      "-" if r["best_accuracy"] is None else f"{r['best_accuracy']:.4f}",
                      verdict(r), style="red" if r["simulated"] else None)
    out.print(table)
    if any(r["simulated"] for r in rows):
        out.print("SIMULATED: runs marked so modelled their accelerators; their figures are not "
                  "measurements.", style="bold red", highlight=False)
