"""Command line: thin wrappers that parse options and call the library."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from automlperf.config import ConfigError
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


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's input errors into one clear line and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (UsageError, ConfigError, GraphError) as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def not_built(name: str) -> None:
    err.print(f"automlperf {name}: not built yet in this version.")
    raise typer.Exit(2)


def fmt_ops(value: float) -> str:
    return f"{value:.3e}" if value else "0"


def load_graph(path: Path) -> Graph:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read graph file {path}: {exc.strerror}") from None
    try:
        return Graph.from_json(text)
    except GraphError as exc:
        raise UsageError(f"{path}: {exc}") from None


@app.command()
@user_errors
def ops(
    model: Annotated[str, typer.Option(help="Seed model: resnet50 or resnet_small.")] = "resnet50",
    image_size: Annotated[int, typer.Option(min=8, help="Input side, pixels.")] = 224,
    num_classes: Annotated[int, typer.Option(min=1)] = 1000,
    in_channels: Annotated[int, typer.Option(min=1)] = 3,
    graph: Annotated[Optional[Path], typer.Option(help="Count a saved graph JSON instead.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Images sharing one parameter update.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    summary: Annotated[bool, typer.Option(help="Also print every layer.")] = False,
) -> None:
    """Operations per image (forward, backward, total) of a model, by layer kind."""
    from automlperf.ops import count

    if graph is not None:
        g = load_graph(graph)
        label = str(graph)
    else:
        if model not in seeds.SEEDS:
            raise UsageError(f"unknown model {model!r}; choose one of {', '.join(seeds.SEEDS)}")
        try:
            g = seeds.seed(model, num_classes, image_size, in_channels)
        except GraphError as exc:
            raise UsageError(f"{model} at {image_size}x{image_size}: {exc}") from None
        label = f"{model}, {in_channels}x{image_size}x{image_size}, {num_classes} classes"
    c = count(g, batch_size=batch_size)
    if as_json:
        print(json.dumps(c.to_dict()))
        return
    if summary:
        out.print(g.summary(), highlight=False, soft_wrap=True)
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


def _stub(name: str, doc: str) -> None:
    def command() -> None:
        not_built(name)

    command.__doc__ = doc
    app.command(name, context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True})(command)


for _name, _doc in [
    ("run", "Run the benchmark (primary): launch replicas, stop at the deadline, score."),
    ("worker", "Run one replica: generate, train and record candidates until the deadline."),
    ("slurm", "Write (and submit) a SLURM batch script for a cluster run."),
    ("report", "Write the HTML report of a run directory."),
    ("check", "Recompute every figure of a run directory and verify it."),
    ("compare", "Rank several runs side by side."),
    ("info", "Describe this system: CPUs, memory, accelerators, versions."),
]:
    _stub(_name, _doc)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
