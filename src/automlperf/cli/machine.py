"""Commands about this machine: operation counts, training one architecture, the node
checklist and the system's description."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from automlperf.cli.common import app, err, out, say_error, styled, user_errors
from automlperf.errors import UserError
from automlperf.events import EpochEvent, TrialStatus
from automlperf.graph import Graph, GraphError, seeds


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

    from automlperf.settings import settings_from_options
    from automlperf.train.single import TrainRequest, plan_training, train_planned

    # The data loader says what a missing folder must hold.
    settings = settings_from_options(config, dataset, data_dir=data_dir, data_required=False,
                                     options={"data.image_size": image_size,
                                              "train.precision": precision})
    plan = plan_training(TrainRequest(config=settings, graph=graph, model=model, epochs=epochs,
                                      batch_size=batch_size, devices=devices,
                                      weights_out=weights_out, patience=patience, seed=seed))
    err.print(plan.describe(), highlight=False)
    progress = Progress(TextColumn("epoch {task.fields[epoch]}/{task.fields[epochs]}",
                                   markup=False),
                        BarColumn(), TextColumn("step {task.completed:.0f}/{task.total:.0f}",
                                                markup=False),
                        TextColumn("{task.fields[ips]:>8.0f} img/s  loss {task.fields[loss]:.3f}"
                                   "  acc {task.fields[acc]}", markup=False), TimeElapsedColumn(),
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
                f"{100 * event.data_share:.1f} % and device {100 * (event.device_share or 0):.1f} "
                "% of training time", highlight=False)

    with progress:
        try:
            result = train_planned(plan, on_progress, on_epoch)
        except KeyboardInterrupt:
            err.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
    outcome = result.outcome
    if outcome.status != TrialStatus.COMPLETED:
        say_error(outcome.reason, prefix="trial failed:")
        raise typer.Exit(1)
    err.print(f"best val accuracy {outcome.best_accuracy:.4f} (epoch {(outcome.best_epoch or 0) + 1}); "
              f"{result.ops:.3e} ops in {result.seconds:.1f} s = "
              f"{result.ops / max(result.seconds, 1e-9):.3e} OPS ({outcome.precision})",
              highlight=False)


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

    colours = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}

    def mark(status: str) -> Text:
        return Text(status, style=colours[status])

    def show(check: Check) -> None:
        line = styled((check.status, colours[check.status]), f"  {check.name:<20} {check.summary}")
        if check.advice:
            line.append(f"\n      -> {check.advice}")
        out.print(line, highlight=False, soft_wrap=True)

    report = run_doctor(DoctorRequest(out_dir, quick, devices, precision,
                                      parse_duration(run_duration), data_dir), show)
    table = Table(title="automlperf doctor" + (" (quick)" if quick else ""))
    for col in ("item", "status", "measured", "s"):
        table.add_column(col)
    for c in report.checks:
        table.add_row(c.name, mark(c.status), c.summary, f"{c.seconds:.0f}")
    out.print(table)
    out.print(f"written: {report.path}", highlight=False)
    if report.failed:
        raise typer.Exit(1)


@app.command("verify-data")
@user_errors
def verify_data(
    archives: Annotated[Path, typer.Option(help="The folder holding the official "
                                           "ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar "
                                           "and ILSVRC2012_devkit_t12.tar.gz.")],
    data_dir: Annotated[Path, typer.Option(help="An extracted ImageNet-1k folder (train/<wnid>/, "
                                           "val/) to check against them.")],
) -> None:
    """Check an extracted ImageNet-1k folder against the official archives, file by file and
    label by label, and print its layout-free content root. A site's tool: an official run
    reads the archives themselves and proves them on its own. Exits 1 naming each file that
    differs."""
    from automlperf.dataset.verify import verify_folder

    found = verify_folder(archives, data_dir)
    if not found.ok:
        for line in found.differences[:20]:
            err.print(line, highlight=False, soft_wrap=True)
        more = len(found.differences) - 20
        say_error(f"{data_dir} is not the official data: {len(found.differences):,} "
                  f"difference(s){f' ({more:,} more not shown)' if more > 0 else ''}; restore "
                  "the files from the archives")
        raise typer.Exit(1)
    out.print(f"{found.compared:,} files equal their originals in the official archives, "
              f"each in the devkit's class; content root {found.root} (the images and their "
              "classes, whatever the folder's layout). An official run reads the archives "
              "themselves: give it --data-dir " + str(archives), highlight=False, soft_wrap=True)


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
