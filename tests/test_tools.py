"""tools/sanitize_kernels.py without a GPU: its options, its call list and the boundaries it claims.

The script runs compute-sanitizer over linred's NVRTC kernels on a GPU machine; here only
what it plans is checked: ``--list`` plans calls for every kernel entry point (by linred's
own planning rules, each with sum, mean, max and min), and every shape set that claims a
tile constant ``T`` puts its quantity at ``k*T - 1``, ``k*T`` and ``k*T + 1``, measured on
the calls themselves.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "sanitize_kernels.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("sanitize_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_help(tool, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--tools", "--quick", "--log-dir", "--timeout", "--list", "--driver"):
        assert option in out


def test_list_plans_every_entry_point(tool, capsys):
    assert tool.main(["--list"]) == 0
    out = capsys.readouterr().out
    coverage = out.split("entry point -> planned calls")[1]
    for entry in (*tool.NVRTC_ENTRY_POINTS, *tool.CUPY_ENTRY_POINTS):
        assert f"    {entry} " in coverage, entry


def test_every_nvrtc_entry_point_sees_every_reduction(tool, capsys):
    assert tool.main(["--list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    reductions: dict[str, set[str]] = {}
    for call in listing["calls"]:
        assert not any(e.startswith(("refused", "unknown", "unplanned")) for e in call["entries"]), call
        for entry in call["entries"]:
            reductions.setdefault(entry, set()).add(call["reduction"])
    for entry in tool.NVRTC_ENTRY_POINTS:
        assert reductions.get(entry) == {"sum", "mean", "max", "min"}, entry


def test_shape_sets_hold_their_triples(tool):
    sets = tool.build_sets()
    claims = [s for s in sets if s.T is not None]
    assert len(claims) >= 20
    for s in claims:
        kT = s.k * s.T
        assert s.values == (kT - 1, kT, kT + 1), s.name
        measured = sorted(tool.measure(case, s.quantity, s.tile) for case in s.cases)
        assert measured == [kT - 1, kT, kT + 1], s.name
        assert [case.value for case in s.cases] == list(s.values), s.name
    names = [case.name for case in tool.all_cases(sets)]
    assert len(names) == len(set(names))


def test_each_kernel_family_has_a_boundary_set(tool):
    targets = {s.target for s in tool.build_sets() if s.T is not None}
    expected = {"linred_fixed:fixed_small", "linred_fixed:fixed_rows", "linred_staged", "linred_long", "linred_warp",
                "linred_tile", "linred_tile:vecload", "linred_features"}  # fmt: skip
    assert expected <= targets


def test_quick_keeps_the_middle_of_each_triple(tool):
    full = {s.name: s for s in tool.build_sets()}
    for s in tool.build_sets(quick=True):
        if s.T is not None:
            assert [case.value for case in s.cases] == [s.k * s.T]
        else:
            assert len(s.cases) == len(full[s.name].cases)


def test_sanitizer_log_parsing(tool):
    log = "\n".join(
        [
            "========= COMPUTE-SANITIZER",
            "========= Uninitialized __global__ memory read of size 4 bytes",
            "=========     at 0x150 in linred_tile",
            "=========     by thread (0,0,0) in block (0,0,0)",
            "=========",
            "========= Uninitialized __global__ memory read of size 1 bytes",
            "=========     at 0x290 in void cub::DeviceReduceKernel<int>(int *)",
            "=========",
            "========= Host API memory access error at host access to 0x7f00 of size 400 bytes",
            "=========     Uninitialized access at 0x7f00 on access by cudaMemcopy source",
            "=========",
            "========= ERROR SUMMARY: 3 errors",
        ]
    )
    errors, race, attributed = tool.parse_log(log)
    assert errors == 3 and race == ""
    assert attributed["linred_tile"] == 1 and attributed["host API"] == 1
    run = tool.ToolRun("initcheck", errors=errors, attributed=attributed)
    assert run.judged_errors(strict=False) == 2
    assert run.judged_errors(strict=True) == 3
    assert tool.ToolRun("memcheck", errors=3, attributed=attributed).judged_errors(strict=False) == 3


def test_racecheck_summary_counts_as_the_error_summary(tool):
    """racecheck ends with a RACECHECK SUMMARY line and no ERROR SUMMARY (seen on an H100)."""
    clean = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert tool.parse_log(clean)[0] == 0
    racy = "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n"
    assert tool.parse_log(racy)[0] == 3


def test_fuzz_gpu_cpu_mode_finds_nothing_wrong(tmp_path):
    """tools/fuzz_gpu.py in its host mode for its first 30 cases (a count, not a time: a loaded
    machine runs fewer cases a second): random calls against its float64 reference, no failure
    (exit status 0) and a summary that counts them."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "tools" / "fuzz_gpu.py"
    out = tmp_path / "fuzz.jsonl"
    done = subprocess.run([sys.executable, str(script), "--cpu", "--stop", "30", "--seconds", "250", "--seed", "3",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "fuzz.jsonl.summary.json").read_text())
    assert summary["cases"] == 30 and summary["failures"] == 0
