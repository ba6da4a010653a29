"""Command line: thin wrappers that parse options and call the library."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from automlperf.errors import RunFailure, UserError
from automlperf.events import EpochEvent, TrialStatus
from automlperf.graph import Graph, GraphError, seeds

app = typer.Typer(
    name="automlperf",
    help="AutoML benchmark for AI computers: one score in operations per second.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a problem the user can fix into one clear line and exit status 2, and a run
    that failed after it started into one line and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except RunFailure as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def fmt_ops(value: float) -> str:
    return f"{value:.3e}" if value else "0"


@app.command()
@user_errors
def ops(
    model: Annotated[str, typer.Option(help="Seed model: resnet50 or resnet_small.")] = "resnet50",
    image_size: Annotated[int, typer.Option(min=8, help="Input side, pixels.")] = 224,
    num_classes: Annotated[int, typer.Option(min=1)] = 1000,
    in_channels: Annotated[int, typer.Option(min=1)] = 3,
    width: Annotated[int, typer.Option(min=1, max=16, help="Channel multiplier of "
                                       "resnet_small (model.seed_width).")] = 1,
    graph: Annotated[Optional[Path], typer.Option(help="Count a saved graph JSON instead.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Images sharing one parameter update.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    summary: Annotated[bool, typer.Option(help="Also print every layer.")] = False,
) -> None:
    """Operations per image (forward, backward, total) of a model, by layer kind."""
    from automlperf.ops import count, layer_table

    if graph is not None:
        g = Graph.read(graph)
        label = str(graph)
    else:
        if model not in seeds.SEEDS:
            raise UserError(f"unknown model {model!r}; choose one of {', '.join(seeds.SEEDS)}")
        try:
            g = seeds.seed(model, num_classes, image_size, in_channels, width)
        except (GraphError, ValueError) as exc:
            raise UserError(f"{model} at {image_size}x{image_size}: {exc}") from None
        label = (f"{model}{f' x{width}' if width > 1 else ''}, {in_channels}x{image_size}x"
                 f"{image_size}, {num_classes} classes")
    c = count(g, batch_size=batch_size)
    if as_json:
        print(json.dumps(c.to_dict()))
        return
    if summary:
        out.print(layer_table(g), highlight=False, soft_wrap=True)
    table = Table(title=f"Operations per image: {label} (batch size {batch_size})")
    for col in ("layer kind", "FP", "BP", "BP/FP", "total"):
        table.add_column(col, justify="left" if col == "layer kind" else "right")
    for kind, kc in c.by_kind.items():
        bp = kc.backward(batch_size)
        ratio = f"{bp / kc.forward:.4f}" if kc.forward else "-"
        table.add_row(kind, fmt_ops(kc.forward), fmt_ops(bp), ratio, fmt_ops(kc.forward + bp))
    table.add_section()
    table.add_row("total", fmt_ops(c.forward), fmt_ops(c.backward),
                  f"{c.backward / c.forward:.4f}", fmt_ops(c.total), style="bold")
    out.print(table)
    out.print(f"{c.params:,} parameters; {len(g)} layers; weights: MAC 2, add/compare 1, "
              "div 4, exp 8", highlight=False)


@app.command()
@user_errors
def train(
    graph: Annotated[Optional[Path], typer.Option(help="Architecture JSON to train.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Or a seed: resnet50, resnet_small.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="builtin, digits, cifar10, imagenet, synthetic.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Dataset folder.")] = None,
    epochs: Annotated[int, typer.Option(min=1)] = 5,
    batch_size: Annotated[Optional[int], typer.Option(min=1, help="Global batch size.")] = None,
    devices: Annotated[Optional[int], typer.Option(min=1, help="Data-parallel ranks (GPUs, "
                                                   "or CPU processes).")] = None,
    precision: Annotated[Optional[str], typer.Option(help="auto, bf16, fp16, tf32, fp32.")] = None,
    image_size: Annotated[Optional[int], typer.Option(min=8)] = None,
    config: Annotated[Optional[Path], typer.Option(help="TOML configuration.")] = None,
    weights_out: Annotated[Optional[Path], typer.Option(help="Save the best weights "
                                                        "(safetensors).")] = None,
    patience: Annotated[Optional[int], typer.Option(min=1, help="Early stopping patience, "
                                                    "epochs (default: no early stop).")] = None,
    seed: Annotated[int, typer.Option(help="Weight initialisation and shuffling seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per epoch on "
                                          "standard output.")] = False,
) -> None:
    """Train one architecture by itself and print its per-epoch events (a machine check)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from automlperf.config import load_config, set_option
    from automlperf.train.single import TrainRequest, plan_training, train_planned

    tree: dict[str, Any] = {}
    set_option(tree, "data.data_dir", str(data_dir) if data_dir else None)
    set_option(tree, "data.image_size", image_size)
    set_option(tree, "train.precision", precision)
    plan = plan_training(TrainRequest(load_config(config, dataset, tree), graph, model, epochs,
                                      batch_size, devices, weights_out, patience, seed))
    err.print(plan.describe(), highlight=False)
    progress = Progress(TextColumn("epoch {task.fields[epoch]}/{task.fields[epochs]}"),
                        BarColumn(), TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                        TextColumn("{task.fields[ips]:>8.0f} img/s  loss {task.fields[loss]:.3f}"
                                   "  acc {task.fields[acc]}"), TimeElapsedColumn(),
                        console=err, transient=False)
    task = progress.add_task("train", total=1, epoch=1, epochs=epochs, ips=0.0, loss=0.0, acc="-")

    def on_progress(msg: dict[str, Any]) -> None:
        progress.update(task, total=msg["steps"], completed=msg["step"], epoch=msg["epoch"] + 1,
                        ips=msg["images_per_s"], loss=msg["loss"])

    def on_epoch(event: EpochEvent) -> None:
        progress.update(task, completed=progress.tasks[0].total, epoch=event.epoch + 1,
                        ips=event.images_per_s, loss=event.train_loss,
                        acc=f"{event.val_accuracy:.3f}")
        if as_json:
            print(json.dumps(event.to_dict()), flush=True)
        else:
            progress.console.print(
                f"epoch {event.epoch + 1}: loss {event.train_loss:.4f}, val acc "
                f"{event.val_accuracy:.4f}, {event.train_images} + {event.val_images} images, "
                f"{event.ops:.3e} ops, {event.images_per_s:.0f} img/s, data "
                f"{100 * event.data_share:.1f} % of step time", highlight=False)

    with progress:
        try:
            result = train_planned(plan, on_progress, on_epoch)
        except KeyboardInterrupt:
            err.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
    outcome = result.outcome
    if outcome.status != TrialStatus.COMPLETED:
        err.print(f"[bold red]trial failed:[/] {escape(outcome.reason)}", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(1)
    err.print(f"best val accuracy {outcome.best_accuracy:.4f} (epoch {(outcome.best_epoch or 0) + 1}); "
              f"{result.ops:.3e} ops in {result.seconds:.1f} s = "
              f"{result.ops / max(result.seconds, 1e-9):.3e} OPS ({outcome.precision})",
              highlight=False)


@app.command()
@user_errors
def run(
    config: Annotated[Optional[Path], typer.Option(help="TOML configuration.")] = None,
    duration: Annotated[Optional[str], typer.Option(help="Run length, e.g. 10m, 2h "
                                                    "(default: the dataset's preset).")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="builtin (default), digits, imagenet, cifar10, "
                                                   "synthetic.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Dataset folder.")] = None,
    replicas: Annotated[Optional[int], typer.Option(min=1, help="Local replica processes.")] = None,
    devices_per_replica: Annotated[Optional[int], typer.Option(min=1)] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="Where the run is written "
                                                    "(default runs/<date-time>).")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store URL, e.g. postgresql://user@host/db "
                                                 "(password from AUTOMLPERF_STORE_PASSWORD); "
                                                 "default RUN_DIR/history.db.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the interrupted run in --run-dir.")] = False,
    launcher: Annotated[str, typer.Option(help="local: replicas as processes here; slurm: one "
                                          "replica per node of the SLURM job; external: start "
                                          "none, the site's launcher runs `automlperf worker` "
                                          "--replicas times.")] = "local",
) -> None:
    """Run the benchmark: launch replicas, stop at the deadline, score, write the report."""
    from automlperf.runner.primary import RunRequest, run_benchmark
    from automlperf.report.console import summary

    outcome = run_benchmark(RunRequest(config, duration, dataset, data_dir, replicas,
                                       devices_per_replica, run_dir, store, resume, launcher), err)
    out.print(summary(outcome.result, outcome.run_dir))
    out.print(f"result: {outcome.result_path}", highlight=False)
    for what, where in outcome.written.items():
        out.print(f"{what}: {where}", highlight=False)
    for problem in outcome.problems:
        err.print(problem, highlight=False)
    if outcome.state == "failed":
        err.print(f"[bold red]error:[/] the run cannot train: {escape(outcome.reason)}",
                  highlight=False, soft_wrap=True)
    elif outcome.state == "interrupted":
        err.print(f"interrupted: continue with `automlperf run --resume --run-dir "
                  f"{outcome.run_dir}`", highlight=False)
    raise typer.Exit(outcome.exit_code)


@app.command()
@user_errors
def worker(
    run_dir: Annotated[Path, typer.Option(help="The run directory (shared filesystem).")],
    store: Annotated[Optional[str], typer.Option(help="Store URL (default: the run's own).")] = None,
    replica_index: Annotated[Optional[int], typer.Option(min=0, help="This replica's number "
                                                         "(default: from the launcher).")] = None,
    devices: Annotated[Optional[int], typer.Option(min=1, help="Accelerators to use "
                                                   "(default all visible).")] = None,
    threads: Annotated[Optional[int], typer.Option(min=1, help="CPU cores to use (default "
                                                   "SLURM_CPUS_PER_TASK or all).")] = None,
    monitor: Annotated[bool, typer.Option(help="Sample this node's resources (one sampler "
                                          "per node).")] = True,
    wait: Annotated[float, typer.Option(min=0, help="Seconds to wait for the primary to open "
                                        "the run's session (replicas started by a site "
                                        "launcher may come first).")] = 300.0,
) -> None:
    """Run one replica: generate, train and record candidates until the deadline. Its index
    comes from --replica-index or the launcher's rank variable (PMIX_RANK,
    OMPI_COMM_WORLD_RANK, PMI_RANK, PALS_RANKID, FLUX_TASK_RANK, JOB_COMPLETION_INDEX, SLURM)."""
    from automlperf.runner.worker import run_worker

    raise typer.Exit(run_worker(run_dir, store, replica_index, devices, threads, monitor, wait))


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
    revalidate: Annotated[bool, typer.Option(help="Also re-measure the best trial's "
                                             "validation accuracy from its weights.")] = False,
    data_dir: Annotated[Optional[Path], typer.Option(help="The dataset folder here (for "
                                                     "--revalidate, and to rescan the data's "
                                                     "fingerprint); default: the run's.")] = None,
    device: Annotated[Optional[str], typer.Option(help="Where --revalidate runs, e.g. cuda:0 "
                                                  "or cpu (default: the first GPU, else "
                                                  "the CPU).")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recompute every figure of a run directory or a submission bundle and verify it; exit 1
    on any mismatch. A bundle is verified from its own files alone."""
    from automlperf.measure.check import CheckOptions, check_run, official_refusal

    if revalidate and as_json is False:
        err.print("re-measuring the best trial's accuracy after the check…", highlight=False)
    rep = check_run(run_dir, store, CheckOptions(data_dir=data_dir, revalidate=revalidate,
                                                 device=device))
    r = rep.result
    again = rep.revalidation
    if as_json:
        print(json.dumps({"ok": rep.ok, "mismatches": rep.mismatches, "checked": rep.checked,
                          "bundle": rep.bundle, "valid": r.get("valid"),
                          "official": r.get("official"), "simulated": r.get("simulated"),
                          "violations": r.get("violations"),
                          "unreadable_images": r.get("unreadable_images"),
                          "revalidation": again.to_dict() if again else None}))
    else:
        for m in rep.mismatches:
            out.print(f"[red]mismatch:[/] {escape(m)}", highlight=False, soft_wrap=True)
        state = "valid" if r.get("valid") else "not valid" + ("" if r.get("official") else ", unofficial")
        if r.get("simulated"):
            state += ", SIMULATED (not a measurement)"
        verdict = "[green]verified[/]" if rep.ok else f"[red]{len(rep.mismatches)} mismatch(es)[/]"
        what = " bundle" if rep.bundle else ""
        out.print(f"{verdict}{what}: {rep.checked.get('trials', 0)} trials, "
                  f"{rep.checked.get('epochs', 0)} epochs recomputed; the result is {state}",
                  highlight=False)
        if again is not None:
            mark = "[green]accuracy re-measured[/]" if again.ok else "[red]accuracy NOT confirmed[/]"
            out.print(f"{mark}: trial {again.trial} (epoch {again.epoch}) scores "
                      f"{again.measured:.4f} on {again.images:,} validation images "
                      f"({again.device}, {again.precision}); recorded {again.recorded:.4f}, "
                      f"tolerance {again.tolerance:.4f}", highlight=False)
        unreadable = r.get("unreadable_images") or {}
        if unreadable.get("train") or unreadable.get("val"):
            out.print(f"  skipped: {unreadable['train']:,} training and {unreadable['val']:,} "
                      "validation images could not be read", highlight=False)
        for v in r.get("violations", []):
            out.print(f"  {v['rule']}: {escape(v['detail'])}", highlight=False)
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
) -> None:
    """Verify a finished run and write its submission bundle: result, configuration, system
    description, MLPerf-style files, records, graphs and logs, report, the best weights and
    a manifest of SHA-256 digests. Check it with `automlperf check BUNDLE`."""
    from automlperf.measure.submit import submit as write_bundle

    done = write_bundle(run_dir, out_path, as_dir, org, system, all_weights, all_samples, store)
    kept = ("all" if done.samples_included == done.samples_stored
            else f"{done.samples_included:,} of {done.samples_stored:,} (those energy needs)")
    out.print(f"bundle: {done.path} ({done.bytes / 1e6:.1f} MB, {done.files:,} files): "
              f"{done.trials:,} trials, {done.epochs:,} epochs, samples {kept}, weights of "
              f"trial(s) {', '.join(map(str, done.weights)) or 'none'}", highlight=False)
    out.print(f"verify it with: automlperf check {done.path}", highlight=False)


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
) -> None:
    """The results list, TOP500-style: every entry verified, official valid results ranked by
    score, the others shown apart with why."""
    from automlperf.measure.units import format_ops
    from automlperf.report.listing import SECTIONS, publish, to_csv, to_json

    def progress(path: Path, entry: dict[str, Any]) -> None:
        err.print(f"{path}: {', '.join(entry['labels'])}", highlight=False)

    rows = publish(entries, html, verify, progress, title)
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
                    "per device", "best acc.", "labels"):
            table.add_column(col, justify="right" if col in ("#", "devices", "nodes") else "left")
        for r in mine:
            table.add_row("-" if r["rank"] is None else str(r["rank"]), str(r["system"]),
                          str(r["accelerators"] or "-"), str(r["devices"] or "-"),
                          str(r["nodes"] or "-"), format_ops(r["score"]),
                          format_ops(r["regulated_score"]), format_ops(r["ops_per_device"]),
                          "-" if r["best_accuracy"] is None else f"{r['best_accuracy']:.4f}",
                          ", ".join(r["labels"]))
            for problem in r["problems"][:3]:
                table.add_row("", f"[red]{escape(problem)}[/]", "", "", "", "", "", "", "", "")
        out.print(table)


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


@app.command()
@user_errors
def doctor(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for doctor.json, the generated "
                                          "images and the short run.")] = Path("doctor"),
    quick: Annotated[bool, typer.Option(help="Every item shrunk (a small seed at 32 px, no "
                                        "compilation, one round): a smoke test, not the "
                                        "official shape's figures.")] = False,
    devices: Annotated[Optional[int], typer.Option(min=1, help="Accelerators to check "
                                                   "(default all).")] = None,
    precision: Annotated[str, typer.Option(help="auto, bf16, fp16, tf32, fp32.")] = "auto",
    run_duration: Annotated[str, typer.Option(help="Length of the short official-shape "
                                              "run.")] = "150s",
    data_dir: Annotated[Optional[Path], typer.Option(help="An ImageNet-layout folder to use "
                                                     "instead of generated images.")] = None,
) -> None:
    """Check this node end to end: devices, ceiling, training, memory, input pipeline,
    energy, and a short run verified by check. Exits 1 when an item fails."""
    from automlperf.config import parse_duration
    from automlperf.runner.doctor import Check, DoctorRequest, run_doctor

    marks = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]",
             "skip": "[dim]skip[/]"}

    def show(check: Check) -> None:
        line = f"{marks[check.status]}  {check.name:<20} {escape(check.summary)}"
        if check.advice:
            line += f"\n      -> {escape(check.advice)}"
        out.print(line, highlight=False, soft_wrap=True)

    report = run_doctor(DoctorRequest(out_dir, quick, devices, precision,
                                      parse_duration(run_duration), data_dir), show)
    table = Table(title="automlperf doctor" + (" (quick)" if quick else ""))
    for col in ("item", "status", "measured", "s"):
        table.add_column(col)
    for c in report.checks:
        table.add_row(c.name, marks[c.status], escape(c.summary), f"{c.seconds:.0f}")
    out.print(table)
    out.print(f"written: {report.path}", highlight=False)
    if report.failed:
        raise typer.Exit(1)


@app.command()
@user_errors
def info(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Describe this system: CPUs, memory, accelerators, software versions."""
    from automlperf.measure.system import describe
    from automlperf.measure.units import format_ops

    desc = describe()
    if as_json:
        print(json.dumps(desc, indent=1))
        return
    table = Table(title=f"automlperf info: {desc['host']}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cpu = desc["cpu"]
    table.add_row("OS", desc["os"])
    table.add_row("CPU", f"{cpu['model']}: {cpu['physical_cores']} physical / "
                         f"{cpu['logical_cores']} logical cores, {cpu['usable_cores']} usable")
    table.add_row("memory", f"{desc['memory_gib']} GiB")
    if desc["accelerators"]:
        for a in desc["accelerators"]:
            peak = f", peak {format_ops(a['peak_ops'])} ({a['peak_precision']})" if a["peak_ops"] else ""
            table.add_row(f"{a.get('type', 'cuda')}:{a['index']}", f"{a['name']}, {a['memory_gib']} GiB, "
                          f"{a.get('uuid', '')}{peak}")
    else:
        table.add_row("accelerators", "none visible: training runs on the CPU")
    table.add_row("software", ", ".join(f"{k} {v}" for k, v in desc["software"].items() if v))
    for k, v in desc["slurm"].items():
        table.add_row(k, v)
    out.print(table)


@app.command()
@user_errors
def slurm(
    nodes: Annotated[int, typer.Option(min=1, help="Nodes: one replica on each.")],
    duration: Annotated[str, typer.Option(help="Run length, e.g. 2h.")],
    run_dir: Annotated[Path, typer.Option(help="Run directory on the shared filesystem.")],
    gpus_per_node: Annotated[int, typer.Option(min=0, help="GPUs per node (0: CPU nodes).")] = 0,
    cpus_per_task: Annotated[Optional[int], typer.Option(min=1, help="CPU cores per replica "
                                                         "(default: every core the job holds on its node).")] = None,
    exclusive: Annotated[bool, typer.Option(
        "--exclusive/--shared-nodes", help="Whole nodes, with all their memory (default), or "
        "share them as the site allows (then set --cpus-per-task and memory with --sbatch, "
        "e.g. --sbatch=--mem-per-cpu=4G).")] = True,
    store: Annotated[Optional[str], typer.Option(help="PostgreSQL URL; default: a private "
                                                 "server in the run directory.")] = None,
    partition: Annotated[Optional[str], typer.Option()] = None,
    account: Annotated[Optional[str], typer.Option()] = None,
    time_limit: Annotated[Optional[str], typer.Option(help="Job time limit (default: duration "
                                                      "plus a margin to write the result).")] = None,
    config: Annotated[Optional[Path], typer.Option(help="TOML configuration.")] = None,
    sbatch_option: Annotated[Optional[list[str]], typer.Option(
        "--sbatch", help="Extra #SBATCH line, e.g. --sbatch=--qos=high (repeatable).")] = None,
    container_image: Annotated[Optional[str], typer.Option(
        help="Run each node's replica in this image: an enroot/pyxis image "
             "(nvcr.io#nvidia/pytorch:25.01-py3, a .sqsh file) or an Apptainer .sif.")] = None,
    container_runtime: Annotated[str, typer.Option(help="pyxis (srun --container-image) or "
                                                   "apptainer (srun apptainer exec).")] = "pyxis",
    container_mount: Annotated[Optional[list[str]], typer.Option(
        help="SRC:DST mounted in the container besides the run directory, e.g. the dataset "
             "(repeatable).")] = None,
    container_option: Annotated[Optional[list[str]], typer.Option(
        help="Extra option for the runtime, e.g. --container-option=--nv for Apptainer on "
             "NVIDIA GPUs, --rocm on AMD (repeatable).")] = None,
    submit: Annotated[bool, typer.Option(help="Submit the script with sbatch.")] = False,
    test_only: Annotated[bool, typer.Option(help="Ask sbatch to validate it, not run it.")] = False,
) -> None:
    """Write a SLURM batch script into the run directory (and submit it with --submit)."""
    from automlperf.config import Config, parse_duration
    from automlperf.runner.slurm import Container, ScriptOptions, submit as sbatch, write_script
    from automlperf.store.urls import resolve_store_url

    seconds = parse_duration(duration)
    limit = parse_duration(time_limit) if time_limit else None
    if config is not None:
        Config.load(config)  # a broken file is refused here, not in the queue
    url = resolve_store_url(store)
    box = None
    if container_image is not None:
        box = Container(container_runtime, container_image, container_mount or [],
                        container_option or [])
    elif container_mount or container_option:
        raise UserError("--container-mount and --container-option need --container-image")
    script = write_script(ScriptOptions(
        run_dir=run_dir, nodes=nodes, duration_s=seconds, gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task, store_url=url, partition=partition, account=account,
        time_limit_s=limit, config=config, sbatch_extra=sbatch_option or [], container=box,
        exclusive=exclusive))
    out.print(f"batch script: {script}", highlight=False)
    if test_only:
        out.print(sbatch(script, test_only=True), highlight=False)
    elif submit:
        job = sbatch(script)
        out.print(f"submitted job {job}; output: {run_dir.resolve()}/logs/slurm-{job}.out",
                  highlight=False)
    else:
        out.print(f"submit it with: sbatch {script}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
