"""``linred tune``: measure the backends on this GPU (or this CPU) and cache the dispatch table.

For each layout, reduction and dtype it times every GPU backend over a range of
segment lengths (CUDA events, median after warm-up, on buffers far larger than
the L2 cache), drops any backend whose result is wrong, and writes rules that
order the backends fastest first.  Fixed lengths are measured twice per size, at
a power of two ``2^s`` and at ``3 * 2^(s-1)`` (the same ``floor(log2)``), since
linred's own kernels treat powers of two apart; their rules say which lengths
they cover.  Runs of lengths with the same order become one rule.  The table goes to ``$LINRED_TUNE_CACHE`` (default
``~/.cache/linred/dispatch.json``) and takes precedence over the shipped one.

``--device cpu`` measures the host backends instead (``numpy`` against ``nvmath`` on
MKL, NumPy arrays, :func:`time.perf_counter`), for the fixed-length sums both serve.
Host timings move between runs (thread wake-ups, other load), so a host rule puts
``nvmath`` first only where the ``[min, max]`` interval of its samples lies wholly
below NumPy's; elsewhere NumPy stays first.  That table goes beside the GPU one
(``dispatch_cpu.json``); there is no shipped host table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from linred.cli import _positive_int

CANDIDATES = ("nvrtc", "cublas", "nvmath", "cub")

#: (layout, op, dtype, log2 sizes): what a full run measures
GRID = (
    ("fixed", "sum", "float32", range(1, 25)),
    ("fixed", "sum", "float16", range(1, 21)),
    ("fixed", "sum", "float64", range(1, 21)),
    ("fixed", "minmax", "float32", range(1, 21, 3)),
    ("variable", "sum", "float32", range(2, 14)),
    ("variable", "minmax", "float32", range(2, 14, 3)),
)
QUICK_GRID = (
    ("fixed", "sum", "float32", range(1, 25, 2)),
    ("variable", "sum", "float32", range(2, 14, 3)),
)
#: the host: fixed-length floating sums, which both host backends serve
HOST_CANDIDATES = ("numpy", "nvmath")
HOST_GRID = (
    ("fixed", "sum", "float32", range(1, 21)),
    ("fixed", "sum", "float64", range(1, 21)),
)
HOST_QUICK_GRID = (("fixed", "sum", "float32", range(1, 21, 3)),)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=("gpu", "cpu"),
        default="gpu",
        help="the GPU's backends (CuPy arrays; default) or the host's (numpy against nvmath on MKL)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and a smaller buffer")
    parser.add_argument(
        "--n",
        type=_positive_int,
        default=None,
        help="elements per buffer (GPU: default 2^26, 2^24 with --quick; CPU: 2^22, 2^20 with --quick)",
    )
    parser.add_argument(
        "--out", default=None, help="where to write the table (default: the tune cache; its folders are made)"
    )
    parser.add_argument("--repeats", type=_positive_int, default=7, help="timed runs per measurement (median)")


def _time(fn: Any, repeats: int) -> float:
    """Median seconds of one call between CUDA events, after two untimed calls (the bench's clock;
    each timed call follows the bench's untimed lead-in, so the GPU runs it at its steady clocks)."""
    from linred.bench.timing import time_device

    # min_sample_s=0: one call per sample; the budget never cuts the repeats short
    return time_device(fn, lib="cupy", warmup=2, repeats=repeats, budget_s=3600.0, min_sample_s=0.0).seconds


def _offsets(n: int, mean: float, rng: np.random.Generator) -> np.ndarray:
    lengths = rng.geometric(1.0 / mean, size=int(n / mean * 1.3) + 16)
    off = np.concatenate([[0], np.cumsum(lengths)])
    off = off[off < n]
    return np.concatenate([off, [n]]).astype(np.int64)


def fixed_length(size: int, lengths: str) -> int:
    """The fixed length measured for ``size`` (``floor(log2(L))``): ``2^size``, or ``3 * 2^(size-1)``."""
    return 1 << size if lengths == "pow2" else 3 << (size - 1)


def jobs(grid: tuple[tuple[str, str, str, range], ...], n: int) -> list[tuple[str, str, str, int, str]]:
    """The measurements of a run over ``grid`` with ``n``-element buffers, in order:
    ``(layout, op, dtype, size, lengths)``.  Fixed sizes are measured at both kinds of
    length; a fixed length longer than the buffer (no segment to time) is left out."""
    return [
        (layout, op, dtype, size, lengths)
        for layout, op, dtype, sizes in grid
        for lengths in (("pow2", "other") if layout == "fixed" else ("any",))
        for size in sizes
        if not (lengths == "other" and size < 1) and not (layout == "fixed" and fixed_length(size, lengths) > n)
    ]


def measure(
    layout: str, op: str, dtype: str, size: int, n: int, repeats: int, rng: np.random.Generator, lengths: str = "pow2"
) -> list[str]:
    """Backends that serve the case correctly, fastest first."""
    import cupy

    import linred

    fn = linred.segmented_sum if op == "sum" else linred.segmented_max
    if layout == "fixed":
        L = fixed_length(size, lengths)
        n = n // L * L
    x = cupy.asarray(rng.standard_normal(n, dtype=np.float32)).astype(dtype)
    if layout == "fixed":
        kwargs: dict[str, Any] = {"segment_length": L}
        ref = x.reshape(-1, L).astype(cupy.float64)
        ref = ref.sum(1) if op == "sum" else ref.max(1)
    else:
        off = _offsets(n, float(1 << size), rng)
        d_off = cupy.asarray(off)
        kwargs = {"offsets": d_off, "check": False}
        x64 = x.astype(cupy.float64)
        if op == "sum":
            cs = cupy.concatenate([cupy.zeros(1), cupy.cumsum(x64)])
            ref = cs[d_off[1:]] - cs[d_off[:-1]]
        else:
            ref = cupy.asarray(np.maximum.reduceat(cupy.asnumpy(x64), off[:-1][np.diff(off) > 0]))
            keep = cupy.asarray(np.diff(off) > 0)
    tol = {"float16": 2e-2, "float32": 1e-4, "float64": 1e-10}[dtype]
    timed = []
    for backend in CANDIDATES:
        try:
            got = fn(x, backend=backend, **kwargs).astype(cupy.float64)
        except linred.BackendError:
            continue
        if layout == "variable" and op != "sum":
            got = got[keep]
        err = float(cupy.linalg.norm(got - ref) / max(float(cupy.linalg.norm(ref)), 1e-30))
        if not err <= tol:
            print(f"  {backend}: wrong result (relative error {err:.1e}); excluded", file=sys.stderr)
            continue
        timed.append((_time(lambda b=backend: fn(x, backend=b, **kwargs), repeats), backend))
    return [b for _, b in sorted(timed)]


def build_rules(results: dict[tuple[str, ...], list[tuple[int, list[str]]]]) -> list[dict[str, Any]]:
    """Merge runs of sizes with the same order into rules (the last size of a run bounds it).

    ``results`` is keyed by ``(layout, op, dtype)`` or ``(layout, op, dtype, lengths)``.
    """
    rules = []
    for key, measured in results.items():
        layout, op, dtype, *rest = key
        lengths = rest[0] if rest else "any"
        measured = sorted(measured)
        for i, (size, order) in enumerate(measured):
            last = i == len(measured) - 1
            if not last and measured[i + 1][1] == order:
                continue
            rule: dict[str, Any] = {"layout": layout, "op": op, "dtypes": [dtype]}
            if lengths != "any":
                rule["lengths"] = lengths
            rule.update({"upto_log2": 64 if last else size, "order": order})
            rules.append(rule)
    return rules


def measure_host(dtype: str, size: int, n: int, repeats: int, rng: np.random.Generator, lengths: str) -> list[str]:
    """Host backends that serve a fixed-length sum correctly: ``nvmath`` first only where its
    samples' ``[min, max]`` lies wholly below ``numpy``'s, else ``numpy`` first."""
    import linred
    from linred.bench.timing import time_host

    L = fixed_length(size, lengths)
    n = n // L * L
    x = rng.standard_normal(n).astype(dtype)
    out = np.empty(n // L, dtype=dtype)
    ref = x.reshape(-1, L).astype(np.float64).sum(1)
    tol = {"float32": 1e-4, "float64": 1e-10}[dtype]
    timed: dict[str, tuple[float, float]] = {}
    for backend in HOST_CANDIDATES:
        try:
            got = linred.segmented_sum(x, L, backend=backend, out=out).astype(np.float64)
        except linred.BackendError:
            continue
        err = float(np.linalg.norm(got - ref) / max(float(np.linalg.norm(ref)), 1e-30))
        if not err <= tol:
            print(f"  {backend}: wrong result (relative error {err:.1e}); excluded", file=sys.stderr)
            continue
        timing = time_host(
            lambda b=backend: linred.segmented_sum(x, L, backend=b, out=out), warmup=2, repeats=repeats, budget_s=2.0
        )
        timed[backend] = (min(timing.samples), max(timing.samples))
    order = [b for b in HOST_CANDIDATES if b in timed]
    if "numpy" in timed and "nvmath" in timed and timed["nvmath"][1] < timed["numpy"][0]:
        order = ["nvmath", "numpy"]
    return order


def write_table(path: Path, device: str, n: int, results: dict[tuple[str, ...], list[tuple[int, list[str]]]]) -> int:
    """Write the dispatch table of ``results`` (measured on ``device`` with ``n``-element buffers)
    to ``path``, make the next plan read it, and return how many rules it has."""
    from linred.backends import select as dispatch

    table = {
        "version": dispatch.TABLE_VERSION,
        "device": device,
        "date": datetime.date.today().isoformat(),
        "n": n,
        "rules": build_rules(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1))
    dispatch.reload()
    return len(table["rules"])


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _writable(path: Path) -> bool:
    """Whether the table can go to ``path`` (its folders made now, before minutes of measuring);
    if not, says why on stderr."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"linred tune: cannot write the table to {path}: {e}", file=sys.stderr)
        return False
    if path.is_dir():
        print(f"linred tune: cannot write the table to {path}: it is a folder", file=sys.stderr)
        return False
    return True


def run_host(args: argparse.Namespace) -> int:
    """``linred tune --device cpu``: the host table."""
    import linred
    from linred.backends import select as dispatch

    path = dispatch.host_cache_path() if args.out is None else Path(args.out)
    if not _writable(path):
        return 2
    n = args.n or (1 << 20 if args.quick else 1 << 22)
    grid = HOST_QUICK_GRID if args.quick else HOST_GRID
    rng = np.random.default_rng(0)
    results: dict[tuple[str, ...], list[tuple[int, list[str]]]] = {}
    todo = jobs(grid, n)
    for done, (layout, op, dtype, size, lengths) in enumerate(todo, 1):
        order = measure_host(dtype, size, n, args.repeats, rng, lengths)
        print(f"[{done}/{len(todo)}] {layout} {op} {dtype} L={fixed_length(size, lengths)}: {' > '.join(order)}")
        if order:
            results.setdefault((layout, op, dtype, lengths), []).append((size, order))
        linred.clear_plan_cache()
    import platform

    device = f"cpu: {platform.processor() or platform.machine()}, {_cores()} cores"
    rules = write_table(path, device, n, results)
    print(f"wrote {rules} host rules to {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "device", "gpu") == "cpu":
        return run_host(args)
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no CUDA device")
    except Exception as e:
        print(f"linred tune needs CuPy and a CUDA GPU: {e}", file=sys.stderr)
        return 2
    import linred
    from linred.backends import select as dispatch

    path = dispatch.tune_cache_path() if args.out is None else Path(args.out)
    if not _writable(path):
        return 2
    n = args.n or (1 << 24 if args.quick else 1 << 26)
    grid = QUICK_GRID if args.quick else GRID
    rng = np.random.default_rng(0)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    results: dict[tuple[str, ...], list[tuple[int, list[str]]]] = {}
    todo = jobs(grid, n)
    for done, (layout, op, dtype, size, lengths) in enumerate(todo, 1):
        order = measure(layout, op, dtype, size, n, args.repeats, rng, "pow2" if lengths == "any" else lengths)
        what = f"L={fixed_length(size, lengths)}" if layout == "fixed" else f"mean 2^{size}"
        print(f"[{done}/{len(todo)}] {layout} {op} {dtype} {what}: {' > '.join(order) or 'none served'}", flush=True)
        if order:
            results.setdefault((layout, op, dtype, lengths), []).append((size, order))
        linred.clear_plan_cache()
        cupy.get_default_memory_pool().free_all_blocks()
    rules = write_table(path, name, n, results)
    print(f"wrote {rules} rules for {name} to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linred tune", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
