"""``linred bench --suite workloads`` on the CPU: end to end, WRONG gating, interleaving, verdicts and the CLI."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import json
import math
import subprocess
import sys

import pytest
from support.bench import STATUSES, parse
from support.bench import run_json as bench_json

torch = pytest.importorskip("torch")

from linred import bench  # noqa: E402
from linred.bench import workloads  # noqa: E402

QUICK = ["--suite", "workloads", "--device", "cpu", "--quick", "--warmup", "1", "--no-progress"]


def run_json(tmp_path, argv: list[str]) -> tuple[int, dict]:
    return bench_json(tmp_path / "workloads.json", [*QUICK, *argv])


def by_name(case: dict) -> dict[str, dict]:
    return {m["name"]: m for m in case["methods"]}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[int, dict, str]:
    """The whole quick suite on the CPU, once (a few seconds)."""
    path = tmp_path_factory.mktemp("workloads") / "all.json"
    done = subprocess.run(
        [sys.executable, "-m", "linred.bench", *QUICK, "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.returncode, json.loads(path.read_text()), done.stdout


def test_every_case_row_and_sample_is_in_the_json(quick_run):
    _, data, out = quick_run
    assert data["suite"] == "workloads"
    meta = data["meta"]
    # (read from the package's metadata, without importing it: a local build tag such as
    # "+cu130", which torch.__version__ carries, is not part of it)
    assert meta["device"] == "cpu" and meta["versions"]["torch"] == importlib.metadata.version("torch")
    repeats = meta["settings"]["repeats"]
    assert repeats >= 7
    expected = workloads.build_cases("cpu", quick=True)
    assert [c["name"] for c in data["cases"]] == [c.name for c in expected]
    assert {c["workload"] for c in data["cases"]} == set(workloads.WORKLOADS)
    for case, wcase in zip(data["cases"], expected, strict=True):
        assert case["status"] == "ok", case
        want = [m.name for m in workloads.METHODS[wcase.workload] if m.applies(wcase, "cpu")]
        assert [m["name"] for m in case["methods"]] == want
        for m in case["methods"]:
            assert m["status"] in STATUSES - {"WRONG", "error"}, (case["name"], m)
            if m["status"] != "ok":
                assert m["note"] and m["device"]["samples"] == [], m
                continue
            s = m["device"]
            assert len(s["samples"]) == repeats and s["calls"] >= 1
            assert s["min"] == min(s["samples"]) and s["max"] == max(s["samples"])
            assert s["min"] <= s["median"] <= s["max"]
            assert 0 <= m["rel_err"] <= workloads.TOLERANCE
            assert s["verdict"] in {"best peer", "faster", "slower", "tie"}
            assert m["host"] is None  # host latency is a GPU measurement
        best = by_name(case)[case["best_peer"]]
        assert best["kind"] == "peer" and best["device"]["verdict"] == "best peer"
        assert best["device"]["median"] == min(
            m["device"]["median"] for m in case["methods"] if m["kind"] == "peer" and m["status"] == "ok"
        )
    # every workload's table, and the summary
    for title in workloads.TITLES.values():
        assert title in out
    assert "Summary: linred (default arguments) against the best peer" in out
    assert max(len(line) for line in out.splitlines()) <= workloads.WIDTH


def test_the_methods_asked_for_are_there(quick_run):
    _, data, _ = quick_run
    gnn = [c for c in data["cases"] if c["workload"] == "gnn"]
    for case in gnn:
        names = set(by_name(case))
        assert {"linred", "linred check=False", "torch.segment_reduce", "zeros.scatter_reduce"} <= names
        assert ("zeros.index_add_" in names) == (case["reduction"] == "sum")
        if importlib.util.find_spec("torch_scatter") is None:
            assert by_name(case)["torch_scatter.segment_csr"]["status"] == "skipped"
    assert {c["mode"] for c in gnn} == {"fwd", "fwd+bwd"} and {c["reduction"] for c in gnn} == {"sum", "mean", "max"}
    emb = [c for c in data["cases"] if c["workload"] == "embedding"]
    for case in emb:
        names = set(by_name(case))
        assert {"F.embedding_bag", "linred weight[input]"} <= names
        assert by_name(case)["linred weight[input]"]["note"] == "includes the gather"
        assert ("linred pre-gathered rows" in names) == (case["mode"] == "fwd")
    windows = [c for c in data["cases"] if c["workload"] == "windows"]
    assert {c["params"]["L"] for c in windows} == {60, 1440}
    for case in windows:
        assert case["params"]["n"] % case["params"]["L"] == 0
        assert {"linred", "torch x.view(-1, L).mean/amax(1)", "numpy x.reshape(-1, L).mean/max(1)"} <= set(
            by_name(case)
        )


# ---------------------------------------------------------------- wrong methods


def _zeros(data, case):
    shape = (data.segments, *data.leaf.shape[1:])
    return lambda t: torch.zeros(shape)  # no work at all: the fastest "method" there is


def _right_once(data, case):
    """Right on the first call, then returns the same buffer without writing it again."""
    cache = []

    def f(t):
        if not cache:
            cache.append(torch.segment_reduce(t, case.reduction, offsets=data.ptr, axis=0))
        return cache[0]

    return f


def _wrong_shape(data, case):
    return lambda t: torch.segment_reduce(t, case.reduction, offsets=data.ptr, axis=0)[1:]


def _nan(data, case):
    return lambda t: torch.segment_reduce(t, case.reduction, offsets=data.ptr, axis=0) * math.nan


def _no_gradient(data, case):
    """The right result, but no gradient flows to the input."""
    return lambda t: torch.segment_reduce(t.detach(), case.reduction, offsets=data.ptr, axis=0) + 0 * t.sum()


FAKES = [
    workloads.Method("fake zeros", "peer", _zeros),
    workloads.Method("fake right once", "peer", _right_once, backward=False),
    workloads.Method("fake wrong shape", "peer", _wrong_shape),
    workloads.Method("fake nan", "peer", _nan),
    workloads.Method("fake no gradient", "peer", _no_gradient),
]
CASE = "gnn N=1024 d=64 graphs=16 sum"  # fwd and fwd+bwd


def test_wrong_methods_are_reported_wrong_and_never_timed(tmp_path, monkeypatch):
    monkeypatch.setitem(workloads.METHODS, "gnn", [*workloads.METHODS["gnn"], *FAKES])
    rc, data = run_json(tmp_path, ["--cases", CASE])
    assert rc == 0  # wrong peers are reported, not a failure of linred
    assert [c["mode"] for c in data["cases"]] == ["fwd", "fwd+bwd"]
    for case in data["cases"]:
        methods = by_name(case)
        fakes = [f for f in FAKES if f.applies(workloads.WCase("gnn", "", "sum", case["mode"] == "fwd+bwd", ()), "cpu")]
        for fake in fakes:
            m = methods[fake.name]
            if fake.name == "fake no gradient" and case["mode"] == "fwd":
                assert m["status"] == "ok"  # its forward is right
                continue
            assert m["status"] == "WRONG", m
            assert m["device"]["samples"] == [] and m["device"]["median"] is None
        assert methods["fake zeros"]["rel_err"] == pytest.approx(1.0)
        assert "shape" in methods["fake wrong shape"]["note"]
        assert "non-finite" in methods["fake nan"]["note"]
        assert case["best_peer"] not in {f.name for f in FAKES}
        assert methods["linred"]["status"] == "ok"
    fwd, fwd_bwd = data["cases"]
    assert "after repeated calls" in by_name(fwd)["fake right once"]["note"]
    assert "fake right once" not in by_name(fwd_bwd)  # forward only
    assert "gradient: relative error" in by_name(fwd_bwd)["fake no gradient"]["note"]


def test_a_wrong_linred_row_fails_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(
        workloads.METHODS, "windows", [*workloads.METHODS["windows"], workloads.Method("linred fake", "linred", _zeros)]
    )
    rc, data = run_json(tmp_path, ["--cases", "windows", "--methods", "linred"])
    assert rc == 1
    assert "linred gave WRONG results" in capsys.readouterr().err
    for case in data["cases"]:
        assert by_name(case)["linred fake"]["status"] == "WRONG"
        assert by_name(case)["linred"]["status"] == "ok"


def test_samples_are_taken_in_turns(tmp_path, monkeypatch):
    log: list[str] = []

    def logged(name):
        def make(data, case):
            def f(t):
                log.append(name)
                return torch.segment_reduce(t, case.reduction, offsets=data.ptr, axis=0)

            return f

        return workloads.Method(name, "peer", make)

    monkeypatch.setitem(workloads.METHODS, "gnn", [logged("A"), logged("B")])
    monkeypatch.setattr(workloads, "MIN_SAMPLE_S", 0.0)  # one call per sample
    rc, data = run_json(tmp_path, ["--cases", "gnn N=1024 d=64 graphs=16 sum fwd", "--repeats", "7", "--warmup", "1"])
    assert rc == 0
    assert [len(m["device"]["samples"]) for m in data["cases"][0]["methods"]] == [7, 7]
    # each: 1 correctness call, 1 warm-up call, 7 samples of 1 call, 2 calls for the last check
    assert log.count("A") == log.count("B") == 11
    sampling = log[4:-4]
    assert len(sampling) == 14
    for i in range(0, 14, 2):  # one sample of each per round
        assert sorted(sampling[i : i + 2]) == ["A", "B"]


def test_errors_and_missing_modules_are_recorded(tmp_path, monkeypatch):
    def broken(data, case):
        raise RuntimeError("no such thing")

    extra = [
        workloads.Method("fake broken", "peer", broken),
        workloads.Method("fake missing", "peer", _zeros, requires=("no_such_module_here",)),
    ]
    monkeypatch.setitem(workloads.METHODS, "gnn", [*workloads.METHODS["gnn"][:1], *extra])
    rc, data = run_json(tmp_path, ["--cases", CASE + " fwd"])
    assert rc == 0
    (case,) = [c for c in data["cases"] if c["mode"] == "fwd"]
    methods = by_name(case)
    assert methods["fake broken"]["status"] == "error" and "no such thing" in methods["fake broken"]["note"]
    assert methods["fake missing"]["status"] == "skipped" and "no_such_module_here" in methods["fake missing"]["note"]
    assert case["best_peer"] is None and methods["linred"]["device"]["verdict"] == ""


def test_max_time_skips_what_remains(tmp_path):
    rc, data = run_json(tmp_path, ["--cases", "windows", "--max-time", "1e-9"])
    assert rc == 0
    assert data["cases"] and all(c["status"] == "skipped" and "time limit" in c["note"] for c in data["cases"])


# ---------------------------------------------------------------- verdicts, cases


def _row(name: str, kind: str, samples: list[float]) -> workloads.Row:
    row = workloads.Row(name, kind)
    row.device.samples = samples
    row.device.close()
    return row


def test_verdict_needs_disjoint_intervals():
    case = workloads.WCase("gnn", "x", "sum", False, ())
    result = workloads.WorkloadResult(
        case,
        rows=[
            _row("fast", "linred", [1.0, 1.1, 1.2]),
            _row("overlap", "linred", [1.9, 2.2, 3.5]),
            _row("slow", "linred", [4.0, 4.5, 5.0]),
            _row("peer", "peer", [2.0, 2.5, 3.0]),
            _row("other peer", "peer", [2.9, 3.0, 3.1]),
        ],
    )
    result.rank()
    verdicts = {r.name: (r.device.verdict, r.device.speedup) for r in result.rows}
    assert verdicts["peer"] == ("best peer", 1.0)
    assert verdicts["fast"] == ("faster", pytest.approx(2.5 / 1.1))
    assert verdicts["overlap"] == ("tie", pytest.approx(2.5 / 2.2))
    assert verdicts["slow"] == ("slower", pytest.approx(2.5 / 4.5))
    assert verdicts["other peer"][0] == "tie"


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("quick", [False, True])
def test_case_names_are_unique_and_sizes_capped(device, quick):
    cases = workloads.build_cases(device, quick)
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    cap = workloads.CAPS[(device, quick)]["values"]
    for c in cases:
        p = c.p
        if c.workload == "gnn":
            assert cap is None or p["n"] * p["d"] <= cap
            assert 1 <= p["graphs"] <= p["n"]
        elif c.workload == "attention":
            assert cap is None or p["n"] * p["d"] <= cap
            assert 1 <= p["graphs"] <= p["n"] and c.reduction == "softmax"
        elif c.workload == "windows":
            assert p["n"] % p["L"] == 0 and p["n"] <= workloads.CAPS[(device, quick)]["series"]
    if device == "gpu" and not quick:
        gnn = {(c.p["n"], c.p["d"], c.p["graphs"]) for c in cases if c.workload == "gnn"}
        assert gnn == set(workloads.GNN_SIZES)
        attention = {(c.p["n"], c.p["d"], c.p["graphs"]) for c in cases if c.workload == "attention"}
        assert attention == set(workloads.ATTENTION_SIZES)
        hosts = {"N=2k d=64 graphs=32", "N=50k d=128 graphs=256", "E=20k heads=1 nodes=2k", "E=200k heads=8 nodes=10k"}
        assert {c.size for c in cases if c.host_time} == hosts
    if device == "cpu":
        assert not any(c.host_time for c in cases)


def test_attention_reference_is_a_softmax_per_node():
    """The attention workload's float64 reference against a per-segment loop."""
    case = next(c for c in workloads.build_cases("cpu", True) if c.workload == "attention" and c.backward)
    data = workloads.Data(case, "cpu")
    y, grad = data.reference(case)
    x, g, ptr = data.x.double(), data.grad_out.double(), data.ptr.tolist()
    for lo, hi in itertools.pairwise(ptr):
        s = torch.softmax(x[lo:hi], 0)
        torch.testing.assert_close(y[lo:hi], s)
        torch.testing.assert_close(grad[lo:hi], s * (g[lo:hi] - (g[lo:hi] * s).sum(0)))


def test_gnn_data_has_no_ties_and_references_match():
    case = next(c for c in workloads.build_cases("cpu", True) if c.workload == "gnn" and c.reduction == "max")
    data = workloads.Data(case, "cpu")
    x = data.x
    assert torch.unique(x[:, 0]).numel() == x.shape[0]  # a column's values are distinct
    assert int(data.ptr[0]) == 0 and int(data.ptr[-1]) == x.shape[0] and bool((data.counts > 0).all())
    (y,) = data.reference(case)
    assert torch.equal(y, torch.segment_reduce(x.double(), "max", offsets=data.ptr, axis=0))


# ---------------------------------------------------------------- the command line


def test_cli_flag(tmp_path):
    path = tmp_path / "cli.json"
    done = subprocess.run(
        [sys.executable, "-m", "linred", "bench", *QUICK, "--cases", "windows", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "windowed time series" in done.stdout and f"wrote {path}" in done.stdout
    data = json.loads(path.read_text())
    assert {c["workload"] for c in data["cases"]} == {"windows"} and len(data["cases"]) == 4


def test_suite_defaults_to_bandwidth_and_is_checked(capsys):
    assert parse([]).suite == "bandwidth"
    assert parse(["--suite", "workloads"]).suite == "workloads"
    with pytest.raises(SystemExit):
        parse(["--suite", "nope"])
    assert (
        "--suite"
        in subprocess.run(
            [sys.executable, "-m", "linred", "bench", "--help"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert bench.run(parse([*QUICK, "--n", "2^10"])) == 2
    assert "--n sets the bandwidth suite" in capsys.readouterr().err
    assert bench.run(parse([*QUICK, "--cases", "no such case"])) == 2
    assert bench.run(parse([*QUICK, "--list", "--cases", "windows"])) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 4 and all(line.startswith("windows") for line in listed)


def test_plot(tmp_path, capsys):
    png = tmp_path / "w.png"
    rc = bench.run(parse([*QUICK, "--cases", "windows n=65520 L=60 mean", "--plot", str(png)]))
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and not png.exists()
        assert "pip install 'linred[bench]'" in capsys.readouterr().err
    else:
        assert rc == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
