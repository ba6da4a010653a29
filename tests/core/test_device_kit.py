"""The GPU measurement kit (``shared/device/lend.sh`` beside the project) imports the project's
own functions into the Python it carries and calls its commands: a rename or a changed
signature here would only show on a lent GPU, minutes into a call. Every ``automlperf``
name its Python imports must resolve, every call of one must bind to the function's
signature, every attribute it reads of an imported module must exist, and every command
and script it runs must take the options it passes."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kit_script() -> Path | None:
    """``$AUTOMLPERF_DEVICE_KIT/lend.sh``, else ``shared/device/lend.sh`` in a folder above
    the checkout (a worktree sits deeper than the main checkout)."""
    given = os.environ.get("AUTOMLPERF_DEVICE_KIT")
    if given:
        return Path(given) / "lend.sh"
    for folder in ROOT.parents:
        if (folder / "shared" / "device" / "lend.sh").is_file():
            return folder / "shared" / "device" / "lend.sh"
    return None


SCRIPT = kit_script()
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="no shared/device/lend.sh beside the project")


def embedded_python(text: str) -> str:
    """The helper the script writes with ``cat > ... <<'PY'``."""
    match = re.search(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
    assert match, "lend.sh no longer embeds its Python helper as <<'PY' ... PY"
    return match.group(1)


def resolved(module: str, name: str) -> Any:
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return getattr(mod, name)
    return importlib.import_module(f"{module}.{name}")  # a submodule


def project_uses(tree: ast.AST) -> tuple[dict[str, Any], list[tuple[ast.Call, Any, str]],
                                         list[tuple[Any, str, str]]]:
    """Per function of the helper: the automlperf names it imports (``{local: object}``),
    the calls of them (call, callee, how it is named), and attributes read of imported
    modules (module, attribute, where)."""
    names: dict[str, Any] = {}
    calls: list[tuple[ast.Call, Any, str]] = []
    attributes: list[tuple[Any, str, str]] = []
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        local: dict[str, Any] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("automlperf"):
                for alias in node.names:
                    obj = resolved(node.module, alias.name)  # type: ignore[arg-type]
                    local[alias.asname or alias.name] = obj
                    names[f"{node.module}.{alias.name}"] = obj
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("automlperf"):
                        importlib.import_module(alias.name)
        for node in ast.walk(func):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in local:
                    calls.append((node, local[f.id], f"{func.name}: {f.id}"))
                elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                      and inspect.ismodule(local.get(f.value.id))):
                    target = getattr(local[f.value.id], f.attr, None)
                    calls.append((node, target, f"{func.name}: {f.value.id}.{f.attr}"))
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and inspect.ismodule(local.get(node.value.id))):
                attributes.append((local[node.value.id], node.attr,
                                   f"{func.name}: {node.value.id}.{node.attr}"))
    return names, calls, attributes


def test_every_project_name_the_kit_imports_resolves_and_every_call_binds():
    tree = ast.parse(embedded_python(SCRIPT.read_text()))  # type: ignore[union-attr]
    names, calls, attributes = project_uses(tree)
    # What the kit measures: the device stage, the doctor's probe and choice, compiled steps.
    assert {"automlperf.train.data.resample.resample_step", "automlperf.runner.doctor.pipeline",
            "automlperf.train.compiling.measure_compile"} <= set(names)
    for module, attr, where in attributes:
        assert hasattr(module, attr), f"lend.sh ({where}): {module.__name__} has no {attr}"
    for call, target, where in calls:
        assert target is not None, f"lend.sh ({where}) calls something that is gone"
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords) or not callable(target):
            continue
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without one
            continue
        try:
            signature.bind(*range(len(call.args)), **{k.arg: None for k in call.keywords})
        except TypeError as exc:
            pytest.fail(f"lend.sh ({where}, line {call.lineno} of its helper) no longer binds "
                        f"to {target.__qualname__}{signature}: {exc}")


def test_the_kits_plan_of_a_step_keeps_its_shape():
    """The kit reads the resampling's plan: (order, table, chunks) with chunks of (start,
    stop, height, width), and windows' (window, taps)."""
    import numpy as np

    from automlperf.train.data.resample import plan_windows, windows

    shapes = np.array([(3, 375, 500), (3, 500, 375)], np.int64)
    box = np.array([(0, 0, 500, 375), (10, 20, 300, 400)], np.float64)
    win, taps = windows(box, shapes[:, 2], shapes[:, 1], 224)
    order, table, chunks = plan_windows(shapes, win, np.arange(2))
    assert len(order) == len(table) == 2 and int(taps) >= 1
    assert all(len(c) == 4 and c[0] < c[1] for c in chunks)


def test_the_commands_and_scripts_the_kit_runs_take_its_options():
    import typer

    from automlperf.cli import app

    text = SCRIPT.read_text()  # type: ignore[union-attr]
    group: Any = typer.main.get_command(app)
    assert {"run", "check", "doctor"} <= set(group.commands)
    shell = text.replace(embedded_python(text), "")
    for command, options in re.findall(r"\bautomlperf (\w+)((?: [^\n|;&]*)?)", shell):
        if command not in group.commands:
            continue  # prose, not a command line
        taken = {o for p in group.commands[command].params for o in p.opts}
        for option in re.findall(r"(?<!\S)(--[\w-]+)", options):
            assert option in taken, f"lend.sh runs `automlperf {command} {option}`: no such option"
    for script, options in re.findall(r'"\$ROOT/(bench/[\w./]+\.py)"((?: [^\n]*)?)', shell):
        path = ROOT / script
        assert path.is_file(), f"lend.sh runs {script}, which is gone"
        source = path.read_text()
        for option in re.findall(r"(?<!\S)(--[\w-]+)", options):
            assert f'"{option}"' in source, f"lend.sh runs {script} {option}: no such option"
