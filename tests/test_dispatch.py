"""Backend selection: ``auto`` picks the first backend that serves a call; a named backend that cannot
serve it raises BackendError with its reason, and no other backend runs (no silent fallback)."""

from __future__ import annotations

import collections
import json
import pickle
from typing import Any

import numpy as np
import pytest
from support import CONTRACT_BACKENDS, check_refusal

import linred
import linred.backends as registry
from linred.backends import select as dispatch
from linred.backends.base import Backend, FunctionExecutor


class FakeBackend(Backend):
    """Counts what the dispatcher asks of it; its executor writes ``mark`` everywhere."""

    def __init__(self, name: str, mark: float, *, refuse: str | None = None, missing: str | None = None) -> None:
        self.name = name  # type: ignore[misc]
        self.mark = mark
        self.refuse = refuse
        self.missing = missing
        self.calls: collections.Counter = collections.Counter()

    def unavailable(self) -> str | None:
        self.calls["unavailable"] += 1
        return self.missing

    def unsupported(self, problem: Any) -> str | None:
        self.calls["unsupported"] += 1
        return self.refuse

    def plan(self, problem: Any) -> FunctionExecutor:
        self.calls["plan"] += 1

        def run(x: Any, out: Any, segments: Any, stream: Any) -> None:
            self.calls["run"] += 1
            out[...] = self.mark

        return FunctionExecutor(run)


@pytest.fixture
def fakes(monkeypatch, clean_plan_cache):
    """Replace the host backends by fakes: 'numpy' refuses, 'nvmath' serves (in that order of preference)."""
    first = FakeBackend("numpy", 1.0, refuse="the first fake cannot do this")
    second = FakeBackend("nvmath", 2.0)
    monkeypatch.setattr(registry, "_loaded", {**registry._loaded, "numpy": first, "nvmath": second})
    monkeypatch.setattr(registry, "_unavailable", {})
    monkeypatch.setattr(linred.backends.select, "HOST_ORDER", ("numpy", "nvmath"))
    yield first, second
    linred.clear_plan_cache()  # drop the fakes' plans before the real backends come back


X = np.arange(12, dtype=np.float32)


def test_auto_takes_the_first_backend_that_serves(fakes):
    first, second = fakes
    got = linred.segmented_sum(X, 4)
    np.testing.assert_array_equal(got, [2.0, 2.0, 2.0])
    assert first.calls["unsupported"] == 1 and first.calls["plan"] == 0 and first.calls["run"] == 0
    assert second.calls["plan"] == 1 and second.calls["run"] == 1
    linred.segmented_sum(X + 1, 4)  # cached: no new planning
    assert second.calls["plan"] == 1 and second.calls["run"] == 2


def test_auto_follows_the_preference_order(fakes, monkeypatch):
    first, second = fakes
    first.refuse = None
    np.testing.assert_array_equal(linred.segmented_sum(X, 4), [1.0, 1.0, 1.0])
    assert second.calls["unsupported"] == 0  # never asked: the first one served
    linred.clear_plan_cache()
    monkeypatch.setattr(linred.backends.select, "HOST_ORDER", ("nvmath", "numpy"))
    np.testing.assert_array_equal(linred.segmented_sum(X, 4), [2.0, 2.0, 2.0])


def test_named_backend_that_refuses_raises_and_nothing_else_runs(fakes):
    first, second = fakes
    with pytest.raises(linred.BackendError, match=r"backend 'numpy' cannot serve this call: the first fake cannot"):
        linred.segmented_sum(X, 4, backend="numpy")
    assert first.calls["run"] == 0
    assert sum(second.calls.values()) == 0, "another backend was consulted: a silent fallback"
    with pytest.raises(linred.BackendError) as info:
        linred.SegmentedReduction(X, 4, backend="numpy")
    check_refusal(info.value, "numpy")
    assert info.value.reason == "the first fake cannot do this"
    assert sum(second.calls.values()) == 0


def test_named_backend_that_serves_is_used(fakes):
    first, _second = fakes
    np.testing.assert_array_equal(linred.segmented_mean(X, 4, backend="nvmath"), [2.0, 2.0, 2.0])
    assert sum(first.calls.values()) == 0
    with linred.SegmentedReduction(X, 4, backend="nvmath") as plan:
        assert plan.backend == "nvmath"


def test_unavailable_backend(fakes):
    _first, second = fakes
    second.missing = "the second fake is not installed"
    with pytest.raises(linred.BackendError, match="the second fake is not installed"):
        linred.segmented_sum(X, 4, backend="nvmath")
    assert second.calls["unsupported"] == 0  # an unavailable backend is not asked about the problem
    assert linred.available_backends()["nvmath"] == "the second fake is not installed"
    assert linred.available_backends()["numpy"] is True


def test_auto_with_no_backend_lists_every_reason(fakes):
    first, second = fakes
    second.refuse = "the second fake cannot either"
    with pytest.raises(linred.BackendError) as info:
        linred.segmented_max(X, 4)
    e = info.value
    assert e.backend == "auto"
    assert "numpy: the first fake cannot do this" in e.reason
    assert "nvmath: the second fake cannot either" in e.reason
    assert "segmented_max of numpy float32" in e.reason  # the problem is described
    assert first.calls["run"] == 0 and second.calls["run"] == 0


def test_degenerate_calls_go_through_the_backend_choice(fakes):
    """An empty result is filled by the front end, but a refusing named backend still refuses."""
    _first, second = fakes
    with pytest.raises(linred.BackendError):
        linred.segmented_sum(np.empty(0, np.float32), offsets=[0, 0], backend="numpy")
    got = linred.segmented_sum(np.empty(0, np.float32), offsets=[0, 0, 0])
    np.testing.assert_array_equal(got, [0.0, 0.0])
    assert second.calls["run"] == 0  # nothing to read: no backend work


def test_backend_error_pickles():
    e = linred.BackendError("cub", "no GPU")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.backend, e2.reason, str(e2)) == ("cub", "no GPU", str(e))
    assert isinstance(e, RuntimeError)


def test_available_backends():
    status = linred.available_backends()
    assert list(status) == list(registry.BACKENDS)
    assert set(CONTRACT_BACKENDS) <= set(status)
    assert status["numpy"] is True
    for name, value in status.items():
        assert value is True or (isinstance(value, str) and value.strip()), f"{name}: {value!r}"
    assert linred.available_backends() == status  # cached, stable


def test_unavailable_backend_refuses_with_its_reason():
    """A backend that cannot run here refuses every call with the reason available_backends() gives."""
    status = linred.available_backends()
    missing = [name for name, value in status.items() if value is not True]
    if not missing:
        pytest.skip("every backend is available here")
    for name in missing:
        with pytest.raises(linred.BackendError) as info:
            linred.segmented_sum(X, 4, backend=name)
        check_refusal(info.value, name)
        assert info.value.reason == status[name]


def _gpu_problem(length: int, dtype: str = "float32") -> Any:
    from linred.problem import Problem

    n = length * 64
    return Problem(
        reduction="sum",
        kind="cupy",
        device=0,
        dtype=dtype,
        acc_dtype="float32" if dtype in ("float16", "bfloat16") else dtype,
        out_dtype=dtype,
        batch=1,
        n=n,
        features=1,
        strides=(n, 1, 1),
        num_segments=64,
        segment_length=length,
        offsets_dtype=None,
    )


@pytest.mark.parametrize(
    "length, dtype, first",
    [
        (256, "float32", "nvrtc"),  # a power of two: the one-launch fixed_rows kernel
        (2048, "float32", "nvrtc"),
        (4096, "float32", "nvrtc"),  # fixed_long
        (2**24, "float32", "nvrtc"),
        (300, "float32", "cublas"),  # not a power of two, too short for fixed_long: a GEMV
        (500, "float32", "cublas"),  # the same rule for the whole octave 256-511
        (1000, "float32", "nvrtc"),  # fixed_long from 2^9
        (100, "float32", "nvrtc"),  # short: the tile kernel beats a GEMV with a tiny inner dimension
        (4096, "float16", "nvrtc"),
        (400, "float16", "nvmath"),
        (3000, "float16", "nvrtc"),
        (128, "float64", "nvrtc"),
        (300, "float64", "nvrtc"),
        (2**20, "float64", "nvrtc"),
        (96, "float64", "nvrtc"),  # the tile kernel: 83% of copy on an H100 where cub made 50% (2026-11-25)
    ],
)
def test_shipped_table_tells_powers_of_two_apart(monkeypatch, length, dtype, first):
    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: dispatch.Path("/nonexistent/table.json"))
    dispatch.reload()
    try:
        assert dispatch.preference(_gpu_problem(length, dtype))[0] == first
    finally:
        dispatch.reload()


def test_a_table_with_unknown_lengths_is_rejected(tmp_path):
    path = tmp_path / "table.json"
    rule = {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "odd", "order": ["cub"]}
    path.write_text(json.dumps({"version": dispatch.TABLE_VERSION, "rules": [rule]}))
    with pytest.raises(ValueError, match="'lengths' must be one of"):
        dispatch._load(path)


def test_tune_rules_merge_runs_and_keep_the_lengths_apart(tmp_path, monkeypatch):
    from linred.cli import tune

    assert [tune.fixed_length(s, "pow2") for s in (1, 5)] == [2, 32]
    assert [tune.fixed_length(s, "other") for s in (1, 5)] == [3, 48]  # the same floor(log2) as 2^s
    first, second = ["nvrtc", "cublas"], ["cublas", "nvrtc"]
    rules = tune.build_rules(
        {
            ("fixed", "sum", "float32", "pow2"): [(3, first), (1, first), (2, first), (4, second)],
            ("fixed", "sum", "float32", "other"): [(1, first), (2, second), (3, second)],
            ("variable", "sum", "float32", "any"): [(2, second)],
        }
    )
    assert rules == [
        {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "pow2", "upto_log2": 3, "order": first},
        {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "pow2", "upto_log2": 64, "order": second},
        {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "other", "upto_log2": 1, "order": first},
        {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "other", "upto_log2": 64, "order": second},
        {"layout": "variable", "op": "sum", "dtypes": ["float32"], "upto_log2": 64, "order": second},
    ]
    # the tuned table comes first and tells 16 (a power of two) from 12 and 24
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"version": dispatch.TABLE_VERSION, "rules": rules}))
    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: path)
    dispatch.reload()
    try:
        assert dispatch.preference(_gpu_problem(16))[:2] == ("cublas", "nvrtc")
        assert dispatch.preference(_gpu_problem(8))[:2] == ("nvrtc", "cublas")
        assert dispatch.preference(_gpu_problem(3))[:2] == ("nvrtc", "cublas")
        assert dispatch.preference(_gpu_problem(12))[:2] == ("cublas", "nvrtc")
    finally:
        dispatch.reload()


def test_tune_times_one_call_per_sample_after_two_untimed(monkeypatch):
    """linred tune times with the bench's clock: two warm-up calls, then ``repeats`` single calls,
    each after the device lead-in (here the most calls, as one takes next to nothing)."""
    from linred.bench import timing
    from linred.cli import tune

    monkeypatch.setattr(timing, "device_clock", lambda lib: timing.HostClock())
    calls = []
    seconds = tune._time(lambda: calls.append(1), 5)
    assert len(calls) == 2 + 5 * (timing.MAX_CALLS + 1)
    assert 0 <= seconds < 0.1


@pytest.mark.gpu
def test_tune_measures_this_gpu_and_dispatch_reads_its_table(tmp_path, monkeypatch):
    """``linred tune --quick`` (on a small buffer): every size it measures is served correctly by
    some backend, it writes rules for fixed lengths (powers of two and others) and offsets, and
    ``auto`` then dispatches by that table."""
    cupy = pytest.importorskip("cupy")
    from linred.cli import tune

    path = tmp_path / "dispatch.json"
    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: path)
    linred.clear_plan_cache()
    try:
        assert tune.main(["--quick", "--n", str(1 << 20), "--repeats", "3"]) == 0
        table = json.loads(path.read_text())
        assert table["version"] == dispatch.TABLE_VERSION
        rules = table["rules"]
        assert {(r["layout"], r.get("lengths", "any")) for r in rules} == {
            ("fixed", "pow2"),
            ("fixed", "other"),
            ("variable", "any"),
        }
        for rule in rules:
            assert rule["order"] and set(rule["order"]) <= set(tune.CANDIDATES), rule
        assert any(r["upto_log2"] == 64 for r in rules if r["layout"] == "variable")
        # L = 2 is size 1: the first power-of-two rule covers it, and is the table in force.
        rule = next(r for r in rules if r.get("lengths") == "pow2")
        assert dispatch.preference(_gpu_problem(2))[: len(rule["order"])] == tuple(rule["order"])
        x = np.random.default_rng(5).standard_normal(1 << 16).astype(np.float32)
        got = cupy.asnumpy(linred.segmented_sum(cupy.asarray(x), 2))
        want = x.astype(np.float64).reshape(-1, 2).sum(1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    finally:
        dispatch.reload()
        linred.clear_plan_cache()


def test_tune_leaves_out_fixed_lengths_longer_than_its_buffer():
    from linred.cli import tune

    todo = tune.jobs(tune.QUICK_GRID, 1 << 20)
    fixed = [(size, lengths) for layout, _, _, size, lengths in todo if layout == "fixed"]
    assert fixed and all(tune.fixed_length(size, lengths) <= 1 << 20 for size, lengths in fixed)
    assert (19, "pow2") in fixed and (19, "other") in fixed  # 2^19 and 3 * 2^18 fit
    assert (21, "pow2") not in fixed
    assert [j for j in todo if j[0] == "variable"] == [("variable", "sum", "float32", s, "any") for s in (2, 5, 8, 11)]
    assert len(tune.jobs(tune.QUICK_GRID, 1 << 24)) == 12 + 12 + 4  # every size fits 2^24


# --- the host table of ``linred tune --device cpu`` ---


def _host_table(monkeypatch, tmp_path, rules: list) -> None:
    gpu = tmp_path / "dispatch.json"
    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: gpu)
    (tmp_path / "dispatch_cpu.json").write_text(json.dumps({"version": dispatch.TABLE_VERSION, "rules": rules}))
    dispatch.reload()


def test_host_order_is_numpy_first_without_a_host_table(monkeypatch, tmp_path):
    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: tmp_path / "dispatch.json")
    dispatch.reload()
    try:
        assert dispatch.host_cache_path() == tmp_path / "dispatch_cpu.json"
        plan = linred.SegmentedReduction(np.ones(64, np.float32), 8)
        assert dispatch.preference(plan._request.problem) == dispatch.HOST_ORDER
    finally:
        dispatch.reload()


def test_a_host_table_orders_the_host_backends(monkeypatch, tmp_path):
    rule = {"layout": "fixed", "op": "sum", "dtypes": ["float32"], "lengths": "pow2", "upto_log2": 4}
    _host_table(monkeypatch, tmp_path, [{**rule, "order": ["nvmath", "numpy"]}])
    try:
        short = linred.SegmentedReduction(np.ones(64, np.float32), 8)._request.problem
        long = linred.SegmentedReduction(np.ones(64, np.float32), 32)._request.problem
        other = linred.SegmentedReduction(np.ones(60, np.float32), 6)._request.problem
        assert dispatch.preference(short) == ("nvmath", "numpy")
        assert dispatch.preference(long) == dispatch.HOST_ORDER  # past the rule's 2^4
        assert dispatch.preference(other) == dispatch.HOST_ORDER  # not a power of two
        if registry.unavailable("nvmath") is None:
            assert linred.SegmentedReduction(np.ones(64, np.float32), 8).backend == "nvmath"
    finally:
        dispatch.reload()


def test_tune_cpu_puts_nvmath_first_only_when_its_interval_is_below_numpys(monkeypatch):
    from linred.bench.timing import Timing
    from linred.cli import tune

    samples = {}

    def fake_time_host(fn, **kwargs):
        backend = fn.__defaults__[0]
        return Timing(seconds=sorted(samples[backend])[1], samples=samples[backend], calls=1, last=None)

    monkeypatch.setattr("linred.bench.timing.time_host", fake_time_host)
    if registry.unavailable("nvmath") is not None:
        pytest.skip("needs nvmath on the host")
    rng = np.random.default_rng(0)
    samples.update(numpy=[1.0, 1.1, 1.2], nvmath=[0.5, 0.9, 1.05])  # overlapping: numpy stays first
    assert tune.measure_host("float32", 3, 4096, 3, rng, "pow2") == ["numpy", "nvmath"]
    samples.update(numpy=[1.0, 1.1, 1.2], nvmath=[0.5, 0.6, 0.9])  # wholly below
    assert tune.measure_host("float32", 3, 4096, 3, rng, "pow2") == ["nvmath", "numpy"]


def test_tune_cpu_writes_a_host_table(tmp_path, capsys):
    from linred.cli import tune

    out = tmp_path / "host.json"
    assert tune.main(["--device", "cpu", "--quick", "--n", "4096", "--repeats", "3", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["version"] == dispatch.TABLE_VERSION and table["device"].startswith("cpu")
    assert table["rules"] and all(set(r["order"]) <= {"numpy", "nvmath"} for r in table["rules"])
    assert "host rules" in capsys.readouterr().out


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize(("n", "segments"), [(10**6, 1), (10**6, 100), (2000, 32)])
def test_shipped_table_gives_feature_rows_max_min_to_nvrtc_at_every_length(monkeypatch, reduction, n, segments):
    """Max and min of feature rows go to linred's feature kernel, which cuts long segments into
    tiles, whatever their mean length: cub's strided kernel, which the table gave segments of 256
    rows or more, reads a segment's feature column in one thread (one segment of 10^6 x 64 float32
    rows: 55 ms on an H200)."""
    from linred.problem import Problem

    monkeypatch.setattr(linred.backends.select, "tune_cache_path", lambda: dispatch.Path("/nonexistent/table.json"))
    dispatch.reload()
    try:
        problem = Problem(reduction, "torch", 0, "float32", "float32", "float32", 1, n, 64, (n * 64, 64, 1), segments,
                          None, "int64")  # fmt: skip
        assert dispatch.rule_key(problem)[0] == "features"
        assert dispatch.preference(problem)[0] == "nvrtc"
    finally:
        dispatch.reload()
