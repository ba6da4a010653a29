"""The package's layers point one way: each imports only from the layers below it (or its
own), no modules import each other in a circle, and the framework-neutral core runs without
torch."""

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import automlperf

PACKAGE = Path(automlperf.__file__).parent

# Bottom to top. The foundation is plain modules every layer may use; ``hardware`` asks
# torch about devices only inside its functions.
LAYERS = [
    {"__init__", "errors", "events", "rules", "config", "procutil", "hardware", "dataset",
     "seeding", "sections", "settings"},
    {"graph"},
    {"ops"},
    {"search"},
    {"train"},
    {"store"},
    {"measure"},
    {"submission"},
    {"report"},
    {"runner"},
    {"cli"},
    {"testing"},  # the tests' and benchmarks' infrastructure, shipped; the product never imports it
]

# Importable, and usable, without torch.
PURE = ["automlperf.errors", "automlperf.events", "automlperf.config", "automlperf.rules",
        "automlperf.hardware", "automlperf.graph", "automlperf.ops", "automlperf.search",
        "automlperf.dataset.archive", "automlperf.dataset.folder", "automlperf.dataset.index",
        "automlperf.dataset.proof", "automlperf.dataset.reader", "automlperf.dataset.shared",
        "automlperf.dataset.tarstream", "automlperf.dataset.verify", "automlperf.dataset.walk",
        "automlperf.seeding", "automlperf.measure.score", "automlperf.train.spec",
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


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root`` by dotted name relative to it; a package by its folder's
    name (``store``), the root package as ``__init__``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)] = path
    return names


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes under ``node`` that run: all but the body of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        test = getattr(child, "test", None)
        if isinstance(child, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                          or getattr(test, "attr", None) == "TYPE_CHECKING"):
            run = child.orelse
        else:
            run = [child]
        for kept in run:
            yield kept
            yield from _runtime_nodes(kept)


def import_graph(root: Path, package: str = "automlperf") -> dict[str, dict[str, int]]:
    """For each module under ``root`` (the folder of ``package``), the modules of the package
    it imports when it runs, at the top or inside a function, each with the line of its
    first import. ``from package.x import y`` imports the module ``x.y`` where there is one,
    else ``x``."""
    names = module_names(root)

    def target(module: str, name: str | None) -> str | None:
        if module != package and not module.startswith(package + "."):
            return None
        base = module[len(package) + 1:] or "__init__"
        sub = name if base == "__init__" else f"{base}.{name}"
        return sub if name and sub in names else base if base in names else None

    graph: dict[str, dict[str, int]] = {}
    for module, path in names.items():
        edges = graph.setdefault(module, {})
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            found = []
            if isinstance(node, ast.Import):
                found = [target(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = [target(node.module, a.name) for a in node.names]
            for name in found:
                if name is not None and name != module:
                    edges.setdefault(name, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The modules that import each other in a circle, one sorted list per circle (the
    strongly connected components of more than one module, by Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph.get(module, {}):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            circle = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(circle) > 1:
                found.append(sorted(circle))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(found)


def rooms(graph: dict[str, dict[str, int]], depth: int) -> dict[str, dict[str, int]]:
    """The import graph with every package below ``depth`` dotted names taken as one room
    (at 2: ``store.service`` for its modules, ``store.rundir`` for itself): who imports whom,
    inside packages as between them."""
    out: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        room = ".".join(module.split(".")[:depth])
        found = out.setdefault(room, {})
        for target, line in edges.items():
            other = ".".join(target.split(".")[:depth])
            if other != room:
                found.setdefault(other, line)
    return out


def test_no_modules_import_each_other_in_a_circle():
    """A circle of imports, even one hidden inside a function, means a helper lives in the
    wrong module; imports only for the type checker are no circle. Inside a package as
    between packages: a sub-package (``store.service``) is one room, which nothing it imports
    may import back, or one of its package's modules points back up at it."""
    graph = import_graph(PACKAGE)
    deepest = max(module.count(".") for module in graph) + 1
    for depth in range(deepest, 0, -1):
        found = cycles(rooms(graph, depth))
        shown = rooms(graph, depth)
        assert not found, f"rooms that import each other in a circle (depth {depth}):\n" + "\n".join(
            ", ".join(f"{a} -> {b} (l.{shown[a][b]})" for a in circle for b in shown[a] if b in circle)
            for circle in found)


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


def test_the_cycle_check_sees_a_circle_a_function_hides(tmp_path):
    root = tmp_path / "automlperf"
    (root / "pkg").mkdir(parents=True)
    for name, text in {"__init__": "", "pkg/__init__": "", "pkg/a": "from automlperf.pkg import b, c\n",
                       "pkg/b": "def f():\n    from automlperf.pkg.a import g\n",
                       "pkg/c": "import typing\nif typing.TYPE_CHECKING:\n    from automlperf.pkg import a\n"
                                "from automlperf import pkg\n"}.items():
        (root / f"{name}.py").write_text(text)
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.b": 1, "pkg.c": 1} and graph["pkg.b"] == {"pkg.a": 2}
    assert graph["pkg.c"] == {"pkg": 4}  # the type checker's import is left out
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_cycle_check_sees_a_sub_package_imported_back_by_a_module_it_imports(tmp_path):
    """As store/rundir.py's ``run_store`` did: a light module reaching, inside a function,
    the module that opens a sub-package which imports the light module (no module circle)."""
    root = tmp_path / "automlperf"
    (root / "pkg" / "sub").mkdir(parents=True)
    for name, text in {"__init__": "", "pkg/__init__": "", "pkg/sub/__init__": "",
                       "pkg/sub/client": "", "pkg/sub/net": "from automlperf.pkg.light import write\n",
                       "pkg/opening": "from automlperf.pkg.sub import client\n",
                       "pkg/light": "def write():\n    from automlperf.pkg.opening import client\n"
                       }.items():
        (root / f"{name}.py").write_text(text)
    graph = import_graph(root)
    assert cycles(graph) == []
    assert cycles(rooms(graph, 2)) == [["pkg.light", "pkg.opening", "pkg.sub"]]
