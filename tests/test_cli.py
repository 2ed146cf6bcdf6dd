"""The ``linred`` command line: info, demo, the lazily imported subcommands, --version."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

import linred
import linred.backends as registry
from linred import cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("cupy", "torch", "nvmath", "cuda.compute", "cuda.core")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"linred {linred.__version__}"


def test_python_dash_m_and_no_heavy_imports():
    # `python -m linred` works, and parsing the command line imports no GPU library.
    code = (
        "import runpy, sys\n"
        "sys.argv = ['linred', '--version']\n"
        "try:\n"
        "    runpy.run_module('linred', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"linred {linred.__version__}", "[]"]


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["info", "--bogus"], ["demo", "--n", "0"], ["demo", "--n", "x"]])
def test_bad_command_lines_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage: linred" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [("1024", 1024), ("2^10", 1024), ("2**20", 1 << 20)])
def test_demo_accepts_powers_of_two(text, value):
    assert cli.build_parser().parse_args(["demo", "--n", text]).n == value


def test_info(capsys):
    rc, out, _ = run_cli(capsys, "info")
    assert rc == 0
    assert f"linred {linred.__version__}" in out
    assert "NumPy" in out
    assert "numpy   available" in out
    for name in registry.BACKENDS:
        assert f"  {name} " in out
    assert {"jax", "dask", "torch", "cupy", "nvmath-python"} <= set(cli.OPTIONAL_PACKAGES)  # (the arrays it takes)
    for package in cli.OPTIONAL_PACKAGES:
        assert f"  {package} " in out
    devices = out.split("CUDA devices:")[1]
    assert "no CUDA device" in devices or "compute capability" in devices


def _break_backend(monkeypatch, broken: str) -> None:
    real = registry.unavailable

    def unavailable(name: str):
        if name == broken:
            raise ImportError(f"cannot import name 'thing' from {broken}")
        return real(name)

    monkeypatch.setattr(registry, "unavailable", unavailable)


def test_info_reports_a_broken_backend(monkeypatch, capsys):
    _break_backend(monkeypatch, "cub")
    rc, out, _ = run_cli(capsys, "info")
    assert rc == 0
    assert "cub     unavailable: module linred.backends.cub failed to import (ImportError: cannot import name" in out


def test_backend_status_never_raises(monkeypatch):
    _break_backend(monkeypatch, "nvmath")
    status = cli.backend_status()
    assert list(status) == list(registry.BACKENDS)
    assert status["numpy"][0] is True
    assert status["nvmath"][0] is False and "failed to import" in status["nvmath"][1]


SMALL_DEMO = ("demo", "--n", "2^16", "-L", "4", "-L", "256", "--mean-length", "16", "--repeat", "2")


def test_demo(capsys):
    rc, out, _ = run_cli(capsys, *SMALL_DEMO)
    assert rc == 0, out
    assert "linred.segmented_sum(x, 4)" in out
    assert out.count("-> [10. 26. 42.]") == 3  # segment_length, offsets and lengths
    assert "L=4, m=16,384" in out and "L=256, m=256" in out and "variable, mean 16" in out
    assert "linred auto -> numpy" in out and "linred numpy" in out
    assert "NumPy np.add.reduceat" in out
    assert "WRONG" not in out
    assert "Every result matched the float64 reference." in out


def test_demo_survives_a_broken_backend(monkeypatch, capsys):
    _break_backend(monkeypatch, "nvmath")
    rc, out, _ = run_cli(capsys, *SMALL_DEMO)
    assert rc == 0, out
    assert "not nvmath: module linred.backends.nvmath failed to import" in out
    assert "linred nvmath" not in out


def test_demo_flags_wrong_results_and_prints_no_speed_for_them(monkeypatch, capsys):
    real = linred.segmented_sum

    def off_by_one(x, *args, out=None, **kwargs):
        result = real(x, *args, out=out, **kwargs)
        if out is not None and out.shape[0] > 3:
            out[1] += 1
        return result

    monkeypatch.setattr(linred, "segmented_sum", off_by_one)
    rc, out, _ = run_cli(capsys, *SMALL_DEMO)
    assert rc == 1
    linred_rows = [line for line in out.splitlines() if "linred numpy" in line or "linred auto" in line]
    assert len(linred_rows) == 6
    for line in linred_rows:
        assert "WRONG" in line and " ms " not in line and " us " not in line
    assert "SOME RESULTS ARE WRONG" in out


def test_demo_reports_a_backend_that_crashes(monkeypatch, capsys):
    # A backend that is available but fails when planning: shown as an error, exit status 1.
    import linred.cli.demo

    real = linred.SegmentedReduction

    def plan(*args, backend="auto", **kwargs):
        if backend == "cub":
            raise RuntimeError("cuda.compute exploded")
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(linred.cli.demo, "backend_status", lambda: {"numpy": (True, ""), "cub": (True, "")})
    monkeypatch.setattr(linred, "SegmentedReduction", plan)
    rc, out, _ = run_cli(capsys, *SMALL_DEMO)
    assert rc == 1
    assert out.count("ERROR RuntimeError: cuda.compute exploded") == 3
    assert "SOME RESULTS ARE WRONG OR FAILED" in out


# --- subcommands served by modules of their own (bench, tune) ---


@pytest.fixture
def fake_plugin(monkeypatch):
    calls = []
    module = types.ModuleType("linred_fake_plugin")

    def add_arguments(parser):
        parser.add_argument("--quick", action="store_true", help="a short run")
        parser.add_argument("--json", metavar="FILE")

    def run(args):
        calls.append(args)
        return 3

    module.add_arguments = add_arguments
    module.run = run
    monkeypatch.setitem(sys.modules, "linred_fake_plugin", module)
    monkeypatch.setitem(cli.PLUGINS, "bench", ("linred_fake_plugin", "fake bench"))
    return calls


def test_plugin_gets_its_arguments_and_sets_the_exit_status(fake_plugin, capsys):
    rc, _, _ = run_cli(capsys, "bench", "--quick", "--json", "out.json")
    assert rc == 3
    assert fake_plugin[0].quick is True and fake_plugin[0].json == "out.json"


def test_plugin_help_is_the_modules(fake_plugin, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: linred bench" in out and "--quick" in out and "a short run" in out


def test_plugin_rejects_unknown_options(fake_plugin, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--nope"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --nope" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(cli.PLUGINS))
def test_missing_plugin_exits_2(command, monkeypatch, capsys):
    monkeypatch.setitem(cli.PLUGINS, command, ("linred._no_such_module", "missing"))
    rc, _, err = run_cli(capsys, command)
    assert rc == 2
    assert f"linred {command}: not available in this installation (linred._no_such_module is missing)" in err


def test_broken_plugin_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "linred_broken_plugin.py").write_text("raise RuntimeError('half-written module')\n")
    (tmp_path / "linred_needy_plugin.py").write_text("import linred_absent_dependency\n")
    (tmp_path / "linred_bare_plugin.py").write_text("def run(args):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = {
        "linred_broken_plugin": "failed to import: RuntimeError: half-written module",
        "linred_needy_plugin": "needs a package that is missing",
        "linred_bare_plugin": "lacks add_arguments(parser) or run(args)",
    }
    for module, message in expected.items():
        monkeypatch.setitem(cli.PLUGINS, "tune", (module, "broken"))
        rc, _, err = run_cli(capsys, "tune")
        assert rc == 2
        assert message in err


@pytest.mark.parametrize("command", sorted(cli.PLUGINS))
def test_real_plugin_help(command, capsys):
    module = cli.PLUGINS[command][0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not part of this checkout yet")
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: linred {command}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--n", "-5"], "argument --n: must be >= 1; got -5"),
        (["tune", "--device", "cpu", "--n", "-5"], "argument --n: must be >= 1; got -5"),
        (["tune", "--device", "cpu", "--n", "0"], "argument --n: must be >= 1; got 0"),
        (["tune", "--device", "cpu", "--repeats", "0"], "argument --repeats: must be >= 1; got 0"),
    ],
)
def test_sizes_and_counts_below_one_exit_2_naming_the_rule(argv, message, tmp_path, monkeypatch, capsys):
    """A size or a count below 1 is refused by the command line, with the rule it breaks (tune
    took --n -5 and wrote an empty table over the cached one; --repeats 0 ended in a traceback)."""
    monkeypatch.setenv("LINRED_TUNE_CACHE", str(tmp_path / "cache.json"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # (no table written)


def test_tune_refuses_a_table_it_cannot_write_before_measuring(tmp_path, capsys, monkeypatch):
    """An --out under a file: exit 2 with the reason, before any measurement."""
    from linred.cli import tune

    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setattr(tune, "measure_host", lambda *a, **k: pytest.fail("measured"))
    assert cli.main(["tune", "--device", "cpu", "--quick", "--out", str(blocker / "x.json")]) == 2
    assert "cannot write the table to" in capsys.readouterr().err


def test_demo_that_runs_no_case_says_so(capsys):
    assert cli.main(["demo", "--n", "100", "-L", "3", "--mean-length", "0"]) == 0
    out = capsys.readouterr().out
    assert "No case ran" in out and "Every result matched" not in out
