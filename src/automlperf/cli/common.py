"""The command line's application, its consoles, and how a user's error becomes one line.

The consoles read no markup: what they print is the text as written, so a message holding
square brackets (``pip install 'automlperf[mlperf]'``, a file name, a list) reaches the
terminal whole. Colour comes from :func:`styled` pieces and ``style=``, never from tags in
the text (tests/report/test_console_text.py holds every console of the package to it)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from automlperf.errors import RunFailure, UserError

app = typer.Typer(
    name="automlperf",
    help="AutoML benchmark for AI computers: one score in operations per second.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Soft wrap: a long line (a command to copy, a path) is never broken by the console.
out = Console(markup=False, soft_wrap=True)
err = Console(stderr=True, markup=False, soft_wrap=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line of plain text pieces, each a string or a (text, Rich style) pair."""
    return Text.assemble(*parts)


def say_error(message: str, prefix: str = "error:") -> None:
    """The one red-prefixed line a failure is told in, on standard error."""
    err.print(styled((prefix, "bold red"), " ", message), highlight=False, soft_wrap=True)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a problem the user can fix into one clear line and exit status 2, and a run
    that failed after it started into one line and its status (1; 3 no clock started; 75
    resumable: automlperf.errors)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            say_error(str(exc))
            raise typer.Exit(2) from None
        except RunFailure as exc:
            say_error(str(exc))
            raise typer.Exit(exc.exit_status) from None

    return wrapper
