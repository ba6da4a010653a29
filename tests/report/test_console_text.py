"""What the terminal shows is the text as written: no console of the package reads Rich
markup, so a message's square brackets (``pip install 'automlperf[mlperf]'``, a list, a file
name) are never taken for tags and eaten. The rule is held for every console, progress
column and help text in the source, so a new print cannot bring the bug back; the messages
it once ate are printed whole."""

import ast
from pathlib import Path

import typer
from typer.testing import CliRunner

from automlperf.cli import app

SRC = Path(__file__).resolve().parents[2] / "src" / "automlperf"
# Rich objects that parse markup in their text unless told not to.
PARSERS = {"Console", "TextColumn"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            yield name, node


def _markup_off(call: ast.Call) -> bool:
    return any(k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_no_console_of_the_package_reads_markup():
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(SRC)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "rich.markup":
                offences.append(f"{where}:{node.lineno}: imports rich.markup (escaping for a "
                                "console that reads markup)")
        for name, call in _calls(tree):
            if name in PARSERS and not _markup_off(call):
                offences.append(f"{where}:{call.lineno}: {name}(...) without markup=False")
            if name == "from_markup":
                offences.append(f"{where}:{call.lineno}: Text.from_markup")
            if any(k.arg == "markup" and not (isinstance(k.value, ast.Constant)
                                              and k.value.value is False) for k in call.keywords):
                if name not in PARSERS:
                    offences.append(f"{where}:{call.lineno}: {name}(..., markup=...) turns "
                                    "markup on")
    assert not offences, "\n".join(offences)


def test_help_texts_hold_no_square_brackets():
    """Typer renders help as Rich markup: a bracket there would be eaten too."""
    group = typer.main.get_command(app)
    found = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        found += [f"{name}: {t!r}" for t in texts if "[" in t]
    assert not found, found


def test_an_error_with_brackets_is_printed_whole():
    done = CliRunner().invoke(app, ["ops", "--model", "resnet[50]"])
    assert done.exit_code == 2
    assert "error: unknown model 'resnet[50]'" in done.output
