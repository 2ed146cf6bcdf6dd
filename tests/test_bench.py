"""``linred bench`` on the CPU: end to end, correctness gating, arithmetic, cases and reporting."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from support.bench import STATUSES, parse
from support.bench import run_json as bench_json

import linred
from linred import bench
from linred.bench import cases, peers, report
from linred.bench.data import TOLERANCE, HostData, bytes_moved
from linred.bench.runner import CaseResult, MethodResult, Settings, run_cases
from linred.bench.timing import HostClock, gbps, lead_calls, plan_samples, take_sample, time_host

TINY = ["--device", "cpu", "--n", "2^12", "--repeats", "3", "--warmup", "1", "--budget", "0.05", "--no-progress"]


def run_json(tmp_path, argv: list[str]) -> tuple[int, dict]:
    return bench_json(tmp_path / "bench.json", [*TINY, *argv])


def test_plot_without_matplotlib_is_an_error_before_the_run(tmp_path, capsys):
    png = tmp_path / "bench.png"
    if importlib.util.find_spec("matplotlib") is not None:
        rc, _ = run_json(tmp_path, ["--plot", str(png)])
        assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return
    rc = bench.run(parse([*TINY, "--plot", str(png)]))
    assert rc == 2
    assert "--plot needs matplotlib: pip install 'linred[bench]'" in capsys.readouterr().err
    assert not png.exists()


def test_unknown_methods_are_an_error_naming_the_valid_ones(capsys):
    rc = bench.run(parse([*TINY, "--methods", "linred,zzz"]))
    assert rc == 2
    err = capsys.readouterr().err
    assert "--methods zzz matches no method; methods: linred auto" in err
    assert "numpy add.reduceat" in err


def test_cpu_bench_end_to_end(tmp_path, capsys):
    rc, data = run_json(tmp_path, [])
    assert rc == 0
    captured = capsys.readouterr()
    assert "Summary: linred auto vs the fastest correct peer" in captured.out

    meta = data["meta"]
    assert meta["device"] == "cpu"
    assert meta["versions"]["linred"] == linred.__version__
    assert meta["versions"]["numpy"] == np.__version__
    assert meta["settings"]["n"] == 2**12
    assert data["copy_gbps_median"] > 0

    names = [c["name"] for c in data["cases"]]
    assert names == [c.name for c in cases.cpu_cases(2**12)]
    assert "L=2^20" not in names  # L larger than n is left out
    for case in data["cases"]:
        assert case["status"] == "ok", case
        assert case["copy_gbps"] > 0
        tol = TOLERANCE[case["dtype"]]
        methods = {m["name"]: m for m in case["methods"]}
        assert {"linred auto", "linred numpy", "numpy add.reduceat"} <= set(methods)
        assert ("numpy X@ones" in methods) == (case["segment_length"] is not None)
        for m in case["methods"]:
            assert m["status"] in STATUSES - {"error"}, m
            if m["status"] == "ok":
                assert m["seconds"] > 0 and m["gbps"] > 0 and m["pct_copy"] > 0, m
                assert m["rel_err"] is not None and m["rel_err"] <= tol, m
                assert len(m["samples"]) >= 3 and m["calls"] >= 1
            else:
                assert m["seconds"] is None and m["gbps"] is None, m
                assert m["note"], m
        assert methods["linred auto"]["status"] == "ok"
        assert case["best_peer"] in methods and methods[case["best_peer"]]["status"] == "ok"
        best = methods[case["best_peer"]]
        auto = methods["linred auto"]
        assert case["auto_vs_best_peer"] == pytest.approx(best["seconds"] / auto["seconds"])
        m = case["num_segments"]
        assert case["bytes"] == 4 * case["n"] + 4 * m + (0 if case["segment_length"] else 8 * (m + 1))


def test_every_line_fits_in_120_columns(tmp_path, capsys):
    rc, _ = run_json(tmp_path, ["--cases", "L=2,geom 16"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120


def _fake(name: str, make) -> peers.Method:
    return peers.Method(name, make, lib="numpy")


def _instant_wrong(inp):
    wrong = np.zeros(inp.out_shape, dtype=inp.x.dtype)
    return lambda: wrong  # no work at all: the fastest "method" there is


def _right_once(inp):
    """Correct on the first call, then stops writing its (reused) output buffer."""
    out = np.empty(inp.out_shape, dtype=inp.x.dtype)
    calls = []

    def fn():
        if not calls:
            out[...] = inp.x.reshape(inp.m, inp.case.length, *inp.x.shape[1:]).sum(axis=1)
        calls.append(1)
        return out

    return fn


def _wrong_shape(inp):
    return lambda: np.zeros(inp.m + 1, dtype=inp.x.dtype)


def _nan(inp):
    bad = np.full(inp.out_shape, np.nan, dtype=inp.x.dtype)
    return lambda: bad


FAKES = [
    _fake("fake instant zeros", _instant_wrong),
    _fake("fake right once", _right_once),
    _fake("fake wrong shape", _wrong_shape),
    _fake("fake nan", _nan),
]


def test_wrong_peers_are_reported_and_never_best(tmp_path, monkeypatch):
    fakes = FAKES
    monkeypatch.setattr(peers, "CPU_PEERS", [*peers.CPU_PEERS, *fakes])
    rc, data = run_json(tmp_path, ["--cases", "L=8,L=32"])
    assert rc == 0  # wrong peers are reported, not a failure of linred
    for case in data["cases"]:
        methods = {m["name"]: m for m in case["methods"]}
        for fake in fakes:
            m = methods[fake.name]
            assert m["status"] == "WRONG", m
            assert m["seconds"] is None and m["gbps"] is None and m["pct_copy"] is None
        assert "relative error" in methods["fake instant zeros"]["note"]
        assert methods["fake instant zeros"]["rel_err"] == pytest.approx(1.0)
        assert "after repeated calls" in methods["fake right once"]["note"]
        assert "shape" in methods["fake wrong shape"]["note"]
        assert "non-finite" in methods["fake nan"]["note"]
        assert case["best_peer"] not in {f.name for f in fakes}


@pytest.mark.parametrize("interleave", [False, True], ids=["one-by-one", "interleaved"])
def test_wrong_peers_in_both_timing_modes(monkeypatch, interleave):
    monkeypatch.setattr(peers, "CPU_PEERS", [*peers.CPU_PEERS, *FAKES])
    settings = Settings(device="cpu", warmup=2, repeats=3, budget_s=0.05, interleave=interleave)
    [result] = run_cases(cases.select_cases(cases.cpu_cases(2**12), "L=8"), settings)
    methods = {m.name: m for m in result.methods}
    for fake in FAKES:
        assert methods[fake.name].status == "WRONG" and methods[fake.name].seconds is None
    assert "after repeated calls" in methods["fake right once"].note
    assert result.best_peer().name not in {f.name for f in FAKES}
    assert result.copy_gbps > 0 and methods["linred auto"].ok


def test_wrong_linred_result_fails_the_run(tmp_path, monkeypatch, capsys):
    wrong_linred = peers.Method("linred wrong", _instant_wrong, lib="numpy", kind="linred")
    real = peers.linred_methods
    monkeypatch.setattr(peers, "linred_methods", lambda device: [*real(device), wrong_linred])
    rc, _ = run_json(tmp_path, ["--cases", "L=8"])
    assert rc == 1
    assert "linred gave WRONG results: L=8: linred wrong" in capsys.readouterr().err


def test_failures_are_recorded_not_raised(tmp_path, monkeypatch):
    def raises(inp):
        raise RuntimeError("boom")

    def refuses(inp):
        def fn():
            raise linred.BackendError("fake", "it cannot")

        return fn

    def skips(inp):
        raise peers.Skip("not here")

    fakes = [
        _fake("fake raises", raises),
        _fake("fake refuses", refuses),
        _fake("fake skips", skips),
        peers.Method("fake needs module", _instant_wrong, requires=("no_such_module_xyz",)),
        peers.Method("fake not applicable", _instant_wrong, applies=lambda inp: "no such dtype"),
        peers.Method("fake left out", _instant_wrong, applies=lambda inp: False),
    ]
    monkeypatch.setattr(peers, "CPU_PEERS", [*peers.CPU_PEERS, *fakes])
    rc, data = run_json(tmp_path, ["--cases", "L=32"])
    assert rc == 0
    methods = {m["name"]: m for m in data["cases"][0]["methods"]}
    assert methods["fake raises"]["status"] == "error" and "boom" in methods["fake raises"]["note"]
    assert methods["fake refuses"]["status"] == "refused" and methods["fake refuses"]["note"] == "it cannot"
    assert methods["fake skips"]["status"] == "skipped" and methods["fake skips"]["note"] == "not here"
    assert methods["fake needs module"]["status"] == "skipped"
    assert "no_such_module_xyz" in methods["fake needs module"]["note"]
    assert methods["fake not applicable"]["status"] == "skipped"
    assert "fake left out" not in methods
    assert methods["numpy X@ones"]["status"] == "ok"


def test_gbps_arithmetic():
    n, L = 2**24, 32
    case = cases.Case("L=32", "fixed", "float32", n, length=L)
    assert bytes_moved(case, n // L) == 4 * n + 4 * (n // L)
    assert gbps(bytes_moved(case, n // L), 1e-3) == pytest.approx((4 * n + 4 * n // L) / 1e-3 / 1e9)
    # variable lengths also read m + 1 int64 offsets; float64 and features scale the bytes
    var = cases.Case("geom 16", "variable", "float32", 1000, layout="geometric", mean=16)
    assert bytes_moved(var, 60) == 4 * 1000 + 4 * 60 + 8 * 61
    feat = cases.Case("d=4 L=2", "features", "float64", 100, features=4, length=2)
    assert bytes_moved(feat, 50) == 8 * 400 + 8 * 200
    assert gbps(3e9, 1.5) == pytest.approx(2.0)


def test_reported_gbps_and_percent_of_copy_follow_from_the_times():
    case = cases.cpu_cases(2**14)[2]
    [result] = run_cases([case], Settings(device="cpu", warmup=1, repeats=3, budget_s=0.05))
    assert result.nbytes == 4 * 2**14 + 4 * result.m
    assert result.copy_gbps == pytest.approx(2 * 4 * 2**14 / result.copy_seconds / 1e9)
    for m in result.methods:
        if m.ok:
            assert m.gbps == pytest.approx(result.nbytes / m.seconds / 1e9)
            assert m.pct_copy == pytest.approx(100 * m.gbps / result.copy_gbps)


def test_host_time_and_replanning_are_recorded():
    """Every timed method records its host time per call; a linred call that plans while timed is flagged."""
    case = cases.select_cases(cases.cpu_cases(2**12), "L=8")
    [result] = run_cases(case, Settings(device="cpu", warmup=1, repeats=3, budget_s=0.05))
    timed = [m for m in result.methods if m.ok]
    assert timed and all(m.host_seconds is not None and m.host_seconds > 0 for m in timed)
    # repeated calls reuse their plan: nothing is planned inside a sample
    assert all(m.replans == 0 for m in timed), [(m.name, m.replans) for m in timed]

    linred.set_plan_cache_size(0)  # every call plans: the timed linred calls must say so
    try:
        [result] = run_cases(case, Settings(device="cpu", warmup=1, repeats=3, budget_s=0.05, methods="linred"))
    finally:
        linred.set_plan_cache_size(64)
    flagged = [m for m in result.methods if m.ok and m.kind == "linred"]
    assert flagged and all(m.replans > 0 and "planned" in m.note for m in flagged)


def test_best_peer_and_ratio():
    r = CaseResult(cases.Case("x", "fixed", "float32", 8, length=2))
    r.methods = [
        MethodResult("linred auto", "linred", seconds=2.0),
        MethodResult("slow peer", "peer", seconds=4.0),
        MethodResult("fast peer", "peer", seconds=1.0),
        MethodResult("wrong peer", "peer", status="WRONG"),
        MethodResult("linred other", "linred", seconds=0.5),
    ]
    assert r.best_peer().name == "fast peer"
    assert r.auto_vs_best_peer() == pytest.approx(0.5)
    r.methods[2].status = "error"
    assert r.best_peer().name == "slow peer"
    assert r.auto_vs_best_peer() == pytest.approx(2.0)


def test_auto_verdict_compares_intervals_not_medians():
    """Faster or slower only when the [min, max] intervals of the samples do not overlap."""
    r = CaseResult(cases.Case("x", "fixed", "float32", 8, length=2))
    auto = MethodResult("linred auto", "linred", seconds=1.0, samples=[0.9, 1.0, 1.1])
    peer = MethodResult("peer", "peer", seconds=1.05, samples=[1.0, 1.05, 1.2])
    r.methods = [auto, peer]
    assert r.auto_vs_best_peer() == pytest.approx(1.05)
    assert r.auto_verdict() == "tie"  # a better median, but the intervals overlap
    peer.samples, peer.seconds = [1.2, 1.3, 1.4], 1.3
    assert r.auto_verdict() == "faster"
    peer.samples, peer.seconds = [0.5, 0.6, 0.7], 0.6
    assert r.auto_verdict() == "slower"
    assert auto.spread == pytest.approx(0.2)
    text = report.format_table([r])
    assert "(slower)" in text
    peer.samples, peer.seconds = [0.95, 1.0, 1.5], 1.0
    text = report.format_table([r])
    assert "(tie: their [min, max] intervals overlap)" in text
    assert "spread 55% of the median" in text  # the peer's (1.5 - 0.95) / 1.0
    assert "tie in 1" in report.format_summary([r])


def test_plan_samples():
    # fast calls are batched up to 1 ms per sample
    assert plan_samples(1e-4, repeats=10, budget_s=2.0) == (10, 10)
    # slow calls: one per sample, as many samples as the budget allows, never fewer than 3
    assert plan_samples(0.5, repeats=10, budget_s=2.0) == (1, 4)
    assert plan_samples(5.0, repeats=10, budget_s=2.0) == (1, 3)
    assert plan_samples(5.0, repeats=2, budget_s=2.0) == (1, 2)
    t = time_host(lambda: 1, warmup=1, repeats=4, budget_s=1.0)
    assert len(t.samples) == 4 and t.last == 1 and t.seconds > 0


def test_lead_calls_precede_the_timed_ones():
    # about 3 ms of untimed calls before a device sample, at least 1, at most 256
    assert lead_calls(4e-4) == 8
    assert lead_calls(1.0) == 1
    assert lead_calls(1e-6) == 256
    calls = []
    seconds, last, host = take_sample(lambda: calls.append(len(calls)) or len(calls), HostClock(), 3, lead=5)
    assert len(calls) == 8 and last == 8  # 5 untimed, then 3 timed: the result is the last timed call's
    assert seconds >= 0 and host >= 0


@pytest.mark.parametrize("layout", ["geometric", "half-empty", "zipf", "one-huge"])
def test_variable_layouts(layout):
    n = 1 << 16
    off = cases.make_offsets(layout, n, 16, seed=3)
    assert off.dtype == np.int64 and off[0] == 0 and off[-1] == n
    lengths = np.diff(off)
    assert (lengths >= 0).all()
    np.testing.assert_array_equal(off, cases.make_offsets(layout, n, 16, seed=3))  # deterministic
    if layout == "geometric":
        assert (lengths >= 1).all() and 14 < lengths.mean() < 18
    elif layout == "half-empty":
        assert 0.45 < (lengths == 0).mean() < 0.55 and 14 < lengths.mean() < 18
    elif layout == "zipf":
        assert np.median(lengths) <= 3 and lengths.max() > 100
    else:
        assert lengths.max() == n // 2 and np.median(lengths) < 16


def test_case_sets_and_selection():
    gpu = cases.gpu_cases(2**28)
    groups = {c.group for c in gpu}
    assert groups == set(cases.GROUPS)
    fixed = [c.length for c in gpu if c.group == "fixed"]
    assert fixed == [2, 8, 32, 128, 1024, 16384, 2**20, 2**24]
    dtypes = [c for c in gpu if c.group == "dtypes"]
    assert {c.dtype for c in dtypes} == {"float16", "bfloat16", "float64"}
    assert {c.n * c.itemsize for c in gpu if c.features == 1} == {2**30}  # the same bytes for every dtype
    assert len(cases.gpu_cases(2**27, quick=True)) < len(gpu)
    sel = cases.select_cases(gpu, "variable,f64 L=8")
    assert [c.name for c in sel] == ["geom 16", "geom 256", "geom 8192", "f64 L=8"]
    assert cases.select_cases(gpu, "SKEWED") == [c for c in gpu if c.group == "skewed"]
    assert [c.name for c in cases.select_cases(gpu, "L=8")] == ["L=8"]  # an exact name selects that case only
    assert [c.name for c in cases.select_cases(gpu, "f64")] == ["f64 L=8", "f64 L=32", "f64 L=128", "f64 L=4096"]
    assert [c.name for c in cases.cpu_cases(2**24)] == [
        "L=2",
        "L=8",
        "L=32",
        "L=128",
        "L=1024",
        "L=2^20",
        "geom 16",
        "geom 256",
    ]


def test_host_reference_handles_empty_segments():
    case = cases.Case("half empty", "skewed", "float32", 1 << 12, layout="half-empty", mean=16)
    data = HostData()
    inp = data.inputs(case)
    ref = data.reference(inp)
    off = inp.host_offsets
    expected = np.array([inp.x[a:b].astype(np.float64).sum() for a, b in itertools.pairwise(off)])
    np.testing.assert_allclose(ref, expected, rtol=1e-12, atol=1e-12)
    err, problem = data.rel_error(linred.segmented_sum(inp.x, offsets=off), ref)
    assert problem is None and err < 1e-6
    # numpy.add.reduceat gives an empty segment the next element: reported as WRONG, as users would get it
    [result] = run_cases([case], Settings(device="cpu", warmup=1, repeats=3, budget_s=0.05))
    methods = {m.name: m for m in result.methods}
    assert methods["numpy add.reduceat"].status == "WRONG"
    assert methods["linred auto"].status == "ok"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("name", ["torch sum", "torch X@ones", "torch segment_reduce(lengths)"])
@pytest.mark.parametrize("case_name", ["L=8", "geom 16", "d=4 L=8"])
def test_torch_peers_on_cpu_tensors(name, case_name):
    """The GPU peers built on torch also run on CPU tensors: their logic is checked here."""
    all_cases = [
        *cases.cpu_cases(1 << 12),
        cases.Case("d=4 L=8", "features", "float32", 1 << 10, features=4, length=8),
    ]
    case = next(c for c in all_cases if c.name == case_name)
    method = next(m for m in [*peers.GPU_PEERS] if m.name == name)
    data = HostData()
    inp = data.inputs(case)
    if method.applies(inp) is not True:
        pytest.skip(f"{name} does not apply to {case_name}")
    out = method.make(inp)()
    err, problem = data.rel_error(out, data.reference(inp))
    assert problem is None and err < 1e-6


def test_gpu_device_without_gpu_is_a_usage_error(capsys):
    from linred.bench.meta import gpu_available

    if gpu_available()[0]:
        pytest.skip("a GPU is present")
    assert bench.run(parse(["--device", "gpu", "--no-progress"])) == 2
    assert "--device gpu" in capsys.readouterr().err


def test_list_and_bad_filter(capsys):
    assert bench.run(parse(["--device", "cpu", "--list"])) == 0
    assert "geom 256" in capsys.readouterr().out
    assert bench.run(parse(["--device", "cpu", "--cases", "nothing-matches"])) == 2


def test_json_is_strict_and_readable_after_each_case(tmp_path):
    path = tmp_path / "b.json"
    results = run_cases(cases.cpu_cases(2**12)[:1], Settings(device="cpu", warmup=1, repeats=3, budget_s=0.05))
    results[0].methods[0].rel_err = float("nan")
    report.write_json(str(path), {"device": "cpu"}, results)
    data = json.loads(path.read_text())  # strict: NaN written as null
    assert data["cases"][0]["methods"][0]["rel_err"] is None


def test_import_is_light_and_module_runs():
    heavy = "('cupy', 'torch', 'matplotlib', 'cuda.compute', 'nvmath')"
    code = f"import sys, linred.bench; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    done = subprocess.run(
        [sys.executable, "-m", "linred.bench", "--device", "cpu", "--list"], capture_output=True, text=True, check=True
    )
    assert "L=1024" in done.stdout


def _has_gpu() -> bool:
    from linred.bench.meta import gpu_available

    return gpu_available()[0]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU with CuPy")
def test_gpu_bench_small(tmp_path):
    """Every GPU method runs on one case of each kind (small buffers: a check of the harness, not figures)."""
    argv = ["--device", "gpu", "--n", "2^22", "--repeats", "3", "--warmup", "2", "--budget", "0.2", "--no-progress"]
    argv += ["--cases", "L=32,geom 16,half empty,f16 L=128,bf16 L=32,f64 L=8,d=64 L=8"]
    path = tmp_path / "gpu.json"
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(tmp_path / "gpu.png")]
    rc = bench.run(parse([*argv, "--json", str(path)]))
    data = json.loads(path.read_text())
    assert data["meta"]["gpu"]["name"]
    problems = []
    for case in data["cases"]:
        assert case["status"] == "ok", case
        assert case["copy_gbps"] > 0
        methods = {m["name"]: m for m in case["methods"]}
        if methods["linred auto"]["status"] != "ok":
            problems.append(f"{case['name']}: linred auto {methods['linred auto']}")
        for m in case["methods"]:
            if m["status"] == "error" or (m["kind"] == "linred" and m["status"] == "WRONG"):
                problems.append(f"{case['name']}: {m['name']}: {m['status']}: {m['note']}")
            if m["status"] == "ok":
                assert m["rel_err"] <= TOLERANCE[case["dtype"]]
    assert not problems, "\n".join(problems)
    assert rc == 0


def test_sampling_shuffles_the_order_of_methods():
    """Each round of samples takes every method once, in a new order: no method always follows the same one."""
    from linred.bench.runner import _Runner, _Timed
    from linred.bench.timing import HostClock

    calls: list[str] = []
    timed = [
        _Timed(MethodResult(name, "peer"), (lambda name=name: calls.append(name)), HostClock(), 1, 3, "numpy")
        for name in "abc"
    ]
    _Runner(Settings(device="cpu"), HostData()).sample(timed)
    rounds = ["".join(calls[i : i + 3]) for i in range(0, 9, 3)]
    assert all(sorted(r) == list("abc") for r in rounds), rounds
    assert len(set(rounds)) > 1, rounds
    assert all(len(t.res.samples) == 3 for t in timed)
