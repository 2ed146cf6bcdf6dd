"""Packaging and repository hygiene: metadata, the installed distribution, README and CI in sync, asv."""

from __future__ import annotations

import doctest
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import linred

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {"cpu", "mkl", "cu12", "cu13", "test", "bench", "docs"}

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_pyproject_metadata(pyproject):
    project = pyproject["project"]
    assert project["name"] == "linred"
    assert project["requires-python"] == ">=3.10"
    assert project["scripts"] == {"linred": "linred.cli:main"}
    assert set(project["optional-dependencies"]) >= EXTRAS
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "linred._version.__version__"}
    deps = " ".join(project["dependencies"])
    assert "numpy" in deps and "nvmath" not in deps  # a light install: NumPy alone serves the host
    assert not any("nvmath" in d for d in project["optional-dependencies"]["cpu"])
    assert any(d.startswith("nvmath-python[cpu]") for d in project["optional-dependencies"]["mkl"])
    for cuda in ("cu12", "cu13"):
        extra = " ".join(project["optional-dependencies"][cuda])
        assert f"cupy-cuda{cuda[2:]}x" in extra and f"nvmath-python[{cuda}]" in extra and f"cuda-cccl[{cuda}]" in extra


def test_pytest_markers_are_declared(pyproject):
    markers = " ".join(pyproject["tool"]["pytest"]["ini_options"]["markers"])
    assert "gpu:" in markers and "slow:" in markers


def test_version_is_a_release_string():
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc|\.dev)?\d*", linred.__version__)


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_package_has_py_typed_marker():
    assert (ROOT / "linred" / "py.typed").exists()


# --- README and CI ---


def readme_quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the Quick start section has no bash code block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quick_start_has_exactly_two_commands():
    commands = readme_quick_start()
    assert len(commands) == 2, commands
    install, tests = commands
    assert 'pip install ".[cpu]"' in install and install.endswith("linred demo")
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    test_command = readme_quick_start()[1]
    lines = [line.strip() for line in script.splitlines()]
    assert any(line.startswith(test_command + " ||") or line == test_command for line in lines), (
        f"the README's test command {test_command!r} is not a line of .ci/run"
    )
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert "python3 -m venv" in script
    assert "ruff check" in script
    assert os.access(ROOT / ".ci" / "run", os.X_OK), ".ci/run must be executable"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


#: the Markdown pages with ``>>>`` examples: the README and every page of docs/ that has them
DOC_PAGES_WITH_EXAMPLES = ["README.md"] + [
    str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")) if ">>>" in p.read_text()
]


def test_doc_pages_with_examples():
    assert {"README.md", "docs/api.md", "docs/index.md", "docs/how-it-works.md"} <= set(DOC_PAGES_WITH_EXAMPLES)


@pytest.mark.parametrize("name", DOC_PAGES_WITH_EXAMPLES)
def test_doc_examples_run(name):
    """The ``>>>`` examples of the Markdown docs are doctests."""
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    blocks = [b for b in python_blocks(ROOT / name) if ">>>" in b]
    assert blocks, f"{name} has no >>> examples"
    globs: dict = {}
    for i, block in enumerate(blocks):  # one namespace for the page, as a reader's session
        test = parser.get_doctest(block, globs, f"{name}[{i}]", name, 0)
        runner.run(test, clear_globs=False)
        globs = test.globs
    assert runner.summarize(verbose=False).failed == 0


def test_readme_backend_table_lists_every_backend():
    from linred.backends import BACKENDS

    for doc in ("README.md", "docs/backends.md"):
        text = (ROOT / doc).read_text()
        for name in BACKENDS:
            assert f"| `{name}` |" in text, f"{doc} does not list backend {name!r}"


# --- the installed distribution (skipped when linred runs from a source tree without being installed) ---


def installed() -> importlib.metadata.Distribution:
    """linred's installed distribution; build metadata left in the source tree (an egg-info) does not count."""
    for dist in importlib.metadata.distributions(name="linred"):
        if Path(dist.locate_file("")).resolve() != ROOT:
            return dist
    pytest.skip("linred is not installed (running from the source tree)")


def is_editable(dist: importlib.metadata.Distribution) -> bool:
    direct_url = dist.read_text("direct_url.json")
    return bool(direct_url) and json.loads(direct_url).get("dir_info", {}).get("editable", False)


def test_installed_metadata_matches_the_source():
    dist = installed()
    assert dist.version == linred.__version__
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"linred": "linred.cli:main"}
    assert set(dist.metadata.get_all("Provides-Extra") or []) >= EXTRAS
    assert dist.metadata["Requires-Python"] == ">=3.10"


def test_installed_files_cover_the_package():
    dist = installed()
    if is_editable(dist):
        pytest.skip("an editable install points at the source tree")
    files = {str(f).replace(os.sep, "/") for f in dist.files or []}
    expected = {str(p.relative_to(ROOT)).replace(os.sep, "/") for p in (ROOT / "linred").rglob("*.py")}
    expected.add("linred/py.typed")
    missing = sorted(expected - files)
    assert not missing, f"the installed distribution lacks {missing} (reinstall, or fix the package data)"


def test_console_script():
    installed()
    exe = shutil.which("linred", path=str(Path(sys.executable).parent)) or shutil.which("linred")
    if exe is None:
        pytest.skip("the linred console script is not on PATH")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"linred {linred.__version__}"


# --- asv (the examples are run by tests/test_examples.py) ---

#: the names of linred the benchmarks may use: asv runs them against older commits too
ASV_LINRED_API = {"segmented_sum", "BackendError", "available_backends"}


def asv_config() -> dict:
    text = (ROOT / "asv.conf.json").read_text()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))


def test_asv_config():
    config = asv_config()
    assert config["benchmark_dir"] == "asv_benchmarks"
    assert config["environment_type"] == "existing"
    assert config["launch_method"] == "spawn"
    assert config["repo"] == "." and config["dvcs"] == "git" and config["branches"] == ["main"]
    for key in ("results_dir", "html_dir", "env_dir"):
        assert config[key].startswith(".asv/"), key
    assert ".asv/" in (ROOT / ".gitignore").read_text().split()


def benchmark_modules() -> list:
    sys.path.insert(0, str(ROOT))
    try:
        return [
            importlib.import_module(f"asv_benchmarks.{p.stem}") for p in sorted((ROOT / "asv_benchmarks").glob("*.py"))
        ]
    finally:
        sys.path.remove(str(ROOT))


def benchmark_classes() -> list:
    """Every parametrized benchmark class (asv's discovery: public classes of every module)."""
    return [
        pytest.param(cls, id=f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
        for module in benchmark_modules()
        for name, cls in vars(module).items()
        if isinstance(cls, type) and not name.startswith("_") and hasattr(cls, "params")
    ]


def sample_parameters(cls) -> list[tuple]:
    """Every method at the first shape and dtype, and every shape and dtype with the first method."""
    methods, shapes, dtypes = cls.params
    combos = [(m, shapes[0], dtypes[0]) for m in methods]
    combos += [(methods[0], s, d) for s in shapes for d in dtypes]
    return list(dict.fromkeys(combos))


@pytest.mark.parametrize("cls", benchmark_classes())
def test_asv_benchmarks_check_run_or_skip(cls, monkeypatch):
    """Each benchmark class at small sizes: setup (with its correctness check), time_sum and track_gbps.

    A skip (NotImplementedError, asv's n/a) is allowed only for a GPU benchmark without a GPU, a
    linred backend that is unavailable or refuses the problem, and a PyTorch method (or a PyTorch
    workload: GNN pooling, embedding bags) without PyTorch.
    """
    module = sys.modules[cls.__module__]
    gpu = cls.__name__.startswith("Gpu") or (
        module.__name__.endswith("workloads") and importlib.util.find_spec("torch") is None
    )
    assert cls.param_names == ("method", "shape", "dtype")
    for name in ("N_CPU", "N_GPU"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, 1 << 16)
    ran = 0
    for params in sample_parameters(cls):
        bench = cls()
        try:
            bench.setup(*params)
        except NotImplementedError as e:
            method = params[0]
            may_skip = gpu or (method.startswith(("linred-", "torch-")) and method != "linred-auto")
            assert may_skip, f"{cls.__name__}{params} skipped: {e}"
            continue
        assert bench.time_sum(*params) is None
        value = bench.track_gbps(*params)
        assert np.isfinite(value) and value > 0, (params, value)
        ran += 1
    assert ran or gpu, f"{cls.__name__}: nothing ran"


def test_asv_gpu_benchmarks_skip_without_a_gpu():
    from linred.bench.meta import gpu_available

    if gpu_available()[0]:
        pytest.skip("a GPU is present")
    for param in benchmark_classes():
        cls = param.values[0]
        if cls.__name__.startswith("Gpu"):
            with pytest.raises(NotImplementedError):
                cls().setup(*(p[0] for p in cls.params))


def test_asv_benchmarks_use_linred_public_api_only():
    """asv runs the current benchmarks against older commits: no linred internals, no new names."""
    import ast

    for path in sorted((ROOT / "asv_benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "linred":
                raise AssertionError(f"{path.name}:{node.lineno}: from {node.module} import ...")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name == "linred" or not alias.name.startswith("linred."), f"{path.name}: {alias.name}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "linred":
                assert node.attr in ASV_LINRED_API, f"{path.name}:{node.lineno}: linred.{node.attr}"


def test_asv_timeraw_benchmarks_run():
    (imports,) = [m for m in benchmark_modules() if m.__name__ == "asv_benchmarks.imports"]
    for name in ("timeraw_import_linred", "timeraw_first_sum"):
        code = getattr(imports, name)()
        code, setup = (code, "") if isinstance(code, str) else code
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        proc = subprocess.run([sys.executable, "-c", f"{setup}\n{code}"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr


def test_asv_check():
    """``asv check``: asv discovers the suite and every signature matches its parameters."""
    pytest.importorskip("asv")
    env = dict(os.environ, ASV_PYTHONPATH=str(ROOT), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "asv", "check", "--python=same"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and "No problems found" in proc.stdout, proc.stdout + proc.stderr
