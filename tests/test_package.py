"""The package as a whole: import hygiene, public names, version, docstring examples."""

from __future__ import annotations

import doctest
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import linred

HEAVY = ("cupy", "torch", "nvmath", "cuda.compute", "cuda.core", "cuda.bindings", "numba")

_HYGIENE = """
import sys
import numpy as np
heavy = {heavy!r}
import linred
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"import linred imported {{loaded}}"
r = linred.segmented_sum(np.arange(1, 13, dtype=np.float32), 4)
assert r.tolist() == [10.0, 26.0, 42.0], r
r = linred.segmented_mean(np.arange(12.0), offsets=[0, 0, 12])
r = linred.segmented_max(np.arange(12), lengths=[3, 9])
with linred.SegmentedReduction(np.arange(12.0), 4) as plan:
    plan(np.ones(12))
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"a NumPy call imported {{loaded}}"
print("clean")
"""


def test_import_is_light():
    """``import linred`` and NumPy calls with backend='auto' import none of the heavy packages."""
    root = str(Path(linred.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _HYGIENE.format(heavy=HEAVY)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def test_public_names():
    expected = {
        "segmented_sum",
        "segmented_mean",
        "segmented_max",
        "segmented_min",
        "available_backends",
        "BackendError",
        "SegmentedReduction",
        "__version__",
    }
    assert expected <= set(linred.__all__)
    for name in linred.__all__:
        assert hasattr(linred, name), name


def test_version():
    assert isinstance(linred.__version__, str)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[\w.]+)?", linred.__version__)


@pytest.mark.parametrize(
    "name", ["segmented_sum", "segmented_mean", "segmented_max", "segmented_min", "segmented_prod"]
)
def test_signature(name):
    import inspect

    params = inspect.signature(getattr(linred, name)).parameters
    assert list(params) == [
        "x",
        "segment_length",
        "offsets",
        "lengths",
        "segment_ids",
        "num_segments",
        "ids_sorted",
        "axis",
        "dtype",
        "out",
        "backend",
        "stream",
        "check",
        "remainder",
    ]
    kw_only = [p for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in kw_only] == [
        "offsets", "lengths", "segment_ids", "num_segments", "ids_sorted", "axis", "dtype", "out", "backend",
        "stream", "check", "remainder",
    ]  # fmt: skip
    defaults = {p.name: p.default for p in params.values() if p.default is not inspect.Parameter.empty}
    assert defaults == {
        "segment_length": None,
        "offsets": None,
        "lengths": None,
        "segment_ids": None,
        "num_segments": None,
        "ids_sorted": None,
        "axis": 0,
        "dtype": None,
        "out": None,
        "backend": "auto",
        "stream": None,
        "check": True,
        "remainder": "error",
    }
    doc = getattr(linred, name).__doc__
    assert "Examples" in doc and "Parameters" in doc and ">>>" in doc


DOCTEST_MODULES = [
    "linred",
    "linred._functions",
    "linred._fused",
    "linred._plan_cache",
    "linred.plan",
    "linred.errors",
    "linred.backends",
]


def test_doctests_cover_every_module_with_public_names():
    """Each module that defines a name of ``linred.__all__`` has its docstring examples run below."""
    objects = [getattr(linred, name) for name in linred.__all__]
    modules = {obj.__module__ for obj in objects if callable(obj)}  # __version__, a str, has no docstring
    missing = sorted(modules - set(DOCTEST_MODULES))
    assert not missing, f"DOCTEST_MODULES lacks {missing}"


@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_docstring_examples(module_name, clean_plan_cache):
    """The examples in the docstrings are true."""
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed (output above)"
    assert result.attempted > 0


# --- the modules: every one imports, no import cycle among them, no backend imports another ---

#: optional dependencies (import names): a module that needs one is skipped where it does not import
OPTIONAL_DEPENDENCIES = {
    "cupy": "CuPy",
    "cupyx": "CuPy",
    "cupy_backends": "CuPy",
    "torch": "PyTorch",
    "nvmath": "nvmath-python",
}

#: the backends (``linred/backends/<name>``); what they share is in the private ``_*`` modules,
#: ``base`` and ``select``, never in another backend
BACKEND_NAMES = ("numpy", "nvmath", "cublas", "cub", "nvrtc")

PACKAGE_DIR = Path(linred.__file__).resolve().parent


def _walked_modules() -> list[str]:
    """linred and every module ``pkgutil.walk_packages`` finds in it, but the ``__main__`` modules
    (importing one runs the command line; the import graph below still reads them)."""
    import pkgutil

    # A package that fails to import is still listed (walk_packages yields it before importing
    # it), and fails in test_every_module_imports; onerror only keeps the walk going.
    found = pkgutil.walk_packages(linred.__path__, "linred.", onerror=lambda name: None)
    names = ["linred", *(info.name for info in found)]
    return [name for name in names if name.rpartition(".")[2] != "__main__"]


def _missing_optional_dependency(e: ImportError) -> str | None:
    """The optional dependency (module) whose import raised ``e`` and fails here too, else None."""
    names = [e.name or ""]
    tb = e.__traceback__
    while tb is not None:  # also the frames of the dependency's own modules (an ImportError without a name)
        names.append(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    for name in names:
        if name.partition(".")[0] in OPTIONAL_DEPENDENCIES:
            try:
                importlib.import_module(name)
            except ImportError:
                return name
    return None


@pytest.mark.parametrize("module_name", _walked_modules())
def test_every_module_imports(module_name):
    """Each module imports; only an optional dependency that does not import here excuses one."""
    try:
        importlib.import_module(module_name)
    except ImportError as e:
        missing = _missing_optional_dependency(e)
        if missing is None:
            raise
        dependency = OPTIONAL_DEPENDENCIES[missing.partition(".")[0]]
        pytest.skip(f"{module_name} needs {dependency} ({missing} does not import here: {e})")


def _source_modules() -> dict[str, Path]:
    """Every module of the package's source tree: dotted name -> file."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _import_statements(tree, module_level: bool):
    """The import statements of a module: all of them, or (``module_level``) those that run when
    it is imported: not those in functions or under ``if TYPE_CHECKING:``."""
    import ast

    if not module_level:
        yield from (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
        return
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))  # class bodies, try, with, other ifs: run at import


def _imported_modules(node, importer: str, is_package: bool, modules) -> set[str]:
    """The linred modules an import statement names: for each name the longest dotted prefix that is a
    module (``from linred.cli import tune`` -> ``linred.cli.tune``; ``from linred.backends import
    BACKENDS`` -> ``linred.backends``).  Parent packages, which Python imports first, are not counted."""
    import ast

    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if is_package else importer.split(".")[:-1]
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
        targets = [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for target in targets:
        parts = target.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts and ".".join(parts) != importer:
            found.add(".".join(parts))
    return found


def _import_graph(module_level: bool = True) -> dict[str, set[str]]:
    """linred module -> the linred modules its import statements import."""
    import ast

    modules = _source_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set()
        for node in _import_statements(tree, module_level):
            graph[name] |= _imported_modules(node, name, is_package, modules)
    return graph


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle (``[a, b, ..., a]``) through the first module of each strongly connected
    component of more than one module (Tarjan's algorithm); empty when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        cycle = None
        while cycle is None:  # breadth first, inside the component, back to start
            step = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w == start:
                        cycle = [*paths[v], start]
                        break
                    if w not in paths:
                        paths[w] = [*paths[v], w]
                        step.append(w)
                if cycle:
                    break
            frontier = step
        cycles.append(cycle)
    return sorted(cycles)


def test_import_graph_sees_cycles_and_relative_imports():
    """The machinery of the test below, on a made-up graph and import statements."""
    import ast

    assert _import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}) == [["a", "b", "c", "a"]]
    assert _import_cycles({"a": {"b"}, "b": set()}) == []
    modules = {"linred", "linred.cli", "linred.cli.tune", "linred.cli._status", "linred.plan"}
    tree = ast.parse(
        "import os\nfrom . import tune\nfrom ._status import backend_status\nfrom .. import plan\n"
        "from linred.cli import tune, main\nimport linred.plan as p\n"
        "if TYPE_CHECKING:\n    import linred\nelse:\n    import linred.cli\n"
        "def f():\n    import linred\n"
    )
    found = set()
    for node in _import_statements(tree, module_level=True):
        found |= _imported_modules(node, "linred.cli.demo", False, modules)
    assert found == {"linred.cli.tune", "linred.cli._status", "linred.plan", "linred.cli"}
    every = set()
    for node in _import_statements(tree, module_level=False):
        every |= _imported_modules(node, "linred.cli.demo", False, modules)
    assert every == found | {"linred"}


def test_no_import_cycle_among_linred_modules():
    """The module-level imports among linred's own modules form no cycle (imports in functions, which
    run later, and under ``if TYPE_CHECKING:``, which never run, do not count)."""
    graph = _import_graph()
    assert {"linred", "linred.cli", "linred.cli.demo", "linred.cli.tune", "linred.backends.numpy"} <= set(graph)
    assert "linred.cli._status" in graph["linred.cli.demo"]  # the graph does see the imports
    cycles = _import_cycles(graph)
    assert not cycles, "import cycles among linred's modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_backend_imports_another():
    """No module of ``linred/backends/<a>`` imports ``linred.backends.<b>`` for another backend ``b``,
    anywhere in the module (an import in a function ties the backends together as well)."""
    graph = _import_graph(module_level=False)

    def backend_of(module: str) -> str | None:
        parts = module.split(".")
        if parts[:2] == ["linred", "backends"] and len(parts) > 2 and parts[2] in BACKEND_NAMES:
            return parts[2]
        return None

    assert {f"linred.backends.{name}" for name in BACKEND_NAMES} <= set(graph)
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if backend_of(module) is not None and backend_of(target) not in (None, backend_of(module))
    )
    assert not offenders, "backends importing other backends:\n" + "\n".join(offenders)
