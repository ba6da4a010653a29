"""The command line's application, its consoles, and how a user's error becomes one line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from automlperf.errors import RunFailure, UserError

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
