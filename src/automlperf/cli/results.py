"""Commands on a finished run: its MLPerf-style logs, its report, its check and its
submission bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from automlperf.cli.common import app, err, out, styled, user_errors
from automlperf.errors import UserError


@app.command()
@user_errors
def mlperf(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.")],
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
    org: Annotated[str, typer.Option(help="Submitter (submission_org, submitter).")] = "unspecified",
) -> None:
    """Write mllog.txt (MLPerf :::MLLOG lines) and system_desc.json of a finished run."""
    if not (run_dir / "result.json").exists():
        raise UserError(f"{run_dir / 'result.json'} is missing: finish the run first")
    from automlperf.runner.primary import mlperf_logs

    written, problems = mlperf_logs(run_dir, store, org)
    for what, where in written.items():
        out.print(f"{what}: {where}", highlight=False)
    for problem in problems:
        err.print(problem, highlight=False)


@app.command()
@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.")],
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
) -> None:
    """Write the HTML report of a run directory (report.html)."""
    from automlperf.report.html import write_report

    path = write_report(run_dir, store)
    out.print(f"report: {path}", highlight=False)


@app.command()
@user_errors
def check(
    run_dir: Annotated[Path, typer.Argument(help="A run directory, a bundle folder or a "
                                            "bundle .tar.gz.")],
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
    official: Annotated[bool, typer.Option(help="Also require an official, valid result "
                                           "(exit 3 otherwise).")] = False,
    remeasure: Annotated[bool, typer.Option(help="Also re-measure the best trial's "
                                            "validation accuracy from its weights.")] = False,
    # The flag's earlier name, kept hidden so that scripts written with it still work.
    revalidate: Annotated[bool, typer.Option("--revalidate", hidden=True)] = False,
    data_dir: Annotated[Optional[Path], typer.Option(help="The dataset here: the official "
                                                     "archives (their MD5s computed and held to "
                                                     "the run's), or a folder (its fingerprint "
                                                     "rescanned); also what --remeasure reads. "
                                                     "Default: the run's.")] = None,
    device: Annotated[Optional[str], typer.Option(help="Where --remeasure runs, e.g. cuda:0 "
                                                  "or cpu (default: the first GPU, else "
                                                  "the CPU).")] = None,
    record: Annotated[bool, typer.Option(help="With --remeasure, on a bundle that verifies: "
                                         "keep the re-measurement in it (remeasurement.json, "
                                         "listed in its manifest), for `automlperf list`.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recompute every figure of a run directory or a submission bundle and verify it; exit 1
    on any mismatch. A bundle is verified from its own files alone."""
    from automlperf.submission.check import CheckOptions, check_run, official_refusal
    from automlperf.submission.remeasure_record import RECORD, describe

    remeasure = remeasure or revalidate
    if remeasure and as_json is False:
        err.print("re-measuring the best trial's accuracy after the check…", highlight=False)
    rep = check_run(run_dir, store, CheckOptions(data_dir=data_dir, remeasure=remeasure,
                                                 device=device, record=record))
    r = rep.result
    again = rep.remeasurement
    if as_json:
        print(json.dumps({"ok": rep.ok, "mismatches": rep.mismatches, "checked": rep.checked,
                          "bundle": rep.bundle, "valid": r.get("valid"),
                          "official": r.get("official"), "simulated": r.get("simulated"),
                          "violations": r.get("violations"),
                          "unreadable_images": r.get("unreadable_images"),
                          "interference": r.get("interference"),
                          "remeasurement": again.to_dict() if again else None,
                          "recorded": rep.recorded}))
    else:
        for m in rep.mismatches:
            out.print(styled(("mismatch:", "red"), " ", m), highlight=False, soft_wrap=True)
        state = "valid" if r.get("valid") else "not valid" + ("" if r.get("official") else ", unofficial")
        if r.get("simulated"):
            state += ", SIMULATED (not a measurement)"
        verdict = (("verified", "green") if rep.ok
                   else (f"{len(rep.mismatches)} mismatch(es)", "red"))
        what = " bundle" if rep.bundle else ""
        out.print(styled(verdict, f"{what}: {rep.checked.get('trials', 0)} trials, "
                         f"{rep.checked.get('epochs', 0)} epochs recomputed; the result is "
                         f"{state}"), highlight=False)
        if again is not None:
            mark = (("accuracy re-measured", "green") if again.ok
                    else ("accuracy NOT confirmed", "red"))
            out.print(styled(mark, f": trial {again.trial} (epoch {again.epoch}) scores "
                      f"{again.measured:.4f} on {again.images:,} validation images "
                      f"({again.device}, {again.precision}); recorded {again.recorded:.4f}, "
                      f"tolerance {again.tolerance:.4f}"), highlight=False)
        if record and rep.recorded is not None:
            out.print(f"recorded in {run_dir} ({RECORD}, {describe(rep.recorded)})",
                      highlight=False)
        elif record:
            err.print("nothing recorded: only a bundle that verifies, with its accuracy "
                      "confirmed, keeps its re-measurement", highlight=False)
        elif rep.recorded is not None:
            out.print(f"carries a re-measurement that verifies: {describe(rep.recorded)}; "
                      f"accuracy {rep.recorded['measured']:.4f}", highlight=False)
        unreadable = r.get("unreadable_images") or {}
        if unreadable.get("train") or unreadable.get("val"):
            out.print(f"  skipped: {unreadable['train']:,} training and {unreadable['val']:,} "
                      "validation images could not be read", highlight=False)
        for v in r.get("violations", []):
            out.print(f"  {v['rule']}: {v['detail']}", highlight=False)
        said = (r.get("interference") or {}).get("why")
        if said:  # from the store's samples and nodes, as recomputed
            out.print(styled(("interference:", "red" if said.startswith("not") else "green"),
                             f" {said}"), highlight=False, soft_wrap=True)
    if not rep.ok:
        raise typer.Exit(1)
    refusal = official_refusal(r) if official else None
    if refusal is not None:
        err.print(refusal, highlight=False, soft_wrap=True)
        raise typer.Exit(3)


@app.command()
@user_errors
def submit(
    run_dir: Annotated[Path, typer.Argument(help="The finished run directory.")],
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Where the bundle is written (default: "
                                                "RUN_NAME.tar.gz here, or RUN_NAME/ with "
                                                "--dir).")] = None,
    as_dir: Annotated[bool, typer.Option("--dir", help="Write a folder, not a .tar.gz.")] = False,
    org: Annotated[Optional[str], typer.Option(help="Submitter (default: system_desc.json's).")] = None,
    system: Annotated[Optional[str], typer.Option(help="The system's name on the list "
                                                  "(default: system_desc.json's).")] = None,
    all_weights: Annotated[bool, typer.Option(help="Every trial's weights, not only the "
                                              "best trial's.")] = False,
    all_samples: Annotated[bool, typer.Option(help="Every monitor sample, even above the "
                                              "20,000 the bundle keeps otherwise.")] = False,
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
    site_details: Annotated[bool, typer.Option(
        help="Keep the site's host names, user, account, cluster and paths (the default); "
             "--no-site-details replaces them with neutral names in every file, and the "
             "bundle still verifies.")] = True,
) -> None:
    """Verify a finished run and write its submission bundle: result, configuration, system
    description, MLPerf-style files, records, graphs and logs, report, the best weights and
    a manifest of SHA-256 digests. Check it with `automlperf check BUNDLE`."""
    from automlperf.submission.submit import submit as write_bundle

    done = write_bundle(run_dir, out_path, as_dir, org, system, all_weights, all_samples, store,
                        site_details=site_details)
    kept = ("all" if done.samples_included == done.samples_stored
            else f"{done.samples_included:,} of {done.samples_stored:,} (those energy needs)")
    out.print(f"bundle: {done.path} ({done.bytes / 1e6:.1f} MB, {done.files:,} files): "
              f"{done.trials:,} trials, {done.epochs:,} epochs, samples {kept}, weights of "
              f"trial(s) {', '.join(map(str, done.weights)) or 'none'}", highlight=False)
    out.print(f"verify it with: automlperf check {done.path}", highlight=False)
