"""The package's layers point one way: each imports only from the layers below it (or its
own), and the framework-neutral core runs without torch."""

import ast
import subprocess
import sys
from pathlib import Path

import automlperf

PACKAGE = Path(automlperf.__file__).parent

# Bottom to top. The foundation is plain modules every layer may use; ``hardware`` asks
# torch about devices only inside its functions.
LAYERS = [
    {"__init__", "errors", "events", "rules", "config", "procutil", "hardware", "dataset_identity",
     "seeding", "sections", "settings"},
    {"graph"},
    {"ops"},
    {"search"},
    {"train"},
    {"store"},
    {"measure"},
    {"report"},
    {"runner"},
    {"cli"},
]

# Importable, and usable, without torch.
PURE = ["automlperf.errors", "automlperf.events", "automlperf.config", "automlperf.rules",
        "automlperf.hardware", "automlperf.graph", "automlperf.ops", "automlperf.search",
        "automlperf.dataset_identity", "automlperf.seeding", "automlperf.measure.score", "automlperf.train.spec",
        "automlperf.train.simulated",
        "automlperf.store"]


def layer_of(module: str) -> int:
    """The layer of a module named relative to the package (``search.bo``, ``config``)."""
    top = module.split(".")[0]
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"automlperf.{module} belongs to no layer: add it to LAYERS")


def imports(path: Path) -> set[str]:
    """Every automlperf module a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("automlperf")}
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("automlperf"):
            if node.module == "automlperf":  # from automlperf import rules
                found |= {f"automlperf.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return found


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = layer_of(module)
        for target in imports(path):
            name = target.removeprefix("automlperf.") or "__init__"
            if name == "__version__":
                continue
            if layer_of(name) > own:
                wrong.append(f"automlperf.{module} imports {target}")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_the_pure_core_does_not_load_torch():
    code = (f"import sys\nfor m in {PURE!r}:\n    __import__(m)\n"
            "from automlperf.graph import seeds\nfrom automlperf.ops import count\n"
            "count(seeds.resnet50())\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"torch was loaded: {done.stdout[:300]}"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from automlperf.runner.session import prepare\n"
                   "from automlperf import config\n")
    assert imports(bad) == {"automlperf.runner.session", "automlperf.config"}
    assert layer_of("runner.session") > layer_of("graph.graph")
