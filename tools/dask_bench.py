"""Segmented reductions of Dask arrays: linred.dask's methods against the single-array call and the Dask idioms.

For each segment layout (a fixed length, default 1000; geometric lengths of mean 256, as
offsets) and each number of chunks (default 3, 10 and 200), it times, on the same persisted
array (its chunks already in memory, on the workers with ``--cluster``):

- ``single``: ``linred.segmented_sum`` of the whole array (NumPy or CuPy), no Dask;
- ``blockwise``: linred.dask on a chunking whose edges are segment edges (the chunks of the
  regular chunking, each edge moved to the nearest segment edge, computed beforehand);
- ``carry`` and ``rechunk``: linred.dask on the regular chunking (``n / chunks`` elements per
  chunk, whose edges cut segments); ``rechunk`` includes its rechunking;
- ``da.coarsen``: ``da.coarsen(np.sum, x, {0: L})`` for the fixed length, on the aligned chunking;
- ``flox``: ``flox.groupby_reduce`` with one int32 label per element (if flox is installed), on
  the regular chunking, its default method.

Each row is ``--samples`` samples (default 5) of building the graph and computing it; reported
as the median with the min and max, with the graph's task count.  The scheduler's own cost of a
task is measured once, on a graph of no-op tasks, and each row shows the share of its median
that its tasks would cost at that rate (a rough split of Dask's overhead from the reduction).

    python tools/dask_bench.py --n 1e7                  # CPU, the threaded scheduler
    python tools/dask_bench.py --n 1e8 --cluster        # CPU, a distributed LocalCluster
    python tools/dask_bench.py --n 1e9 --cupy --cluster  # CuPy chunks on dask_cuda's LocalCUDACluster
    python tools/dask_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import linred
import linred.dask


def _sync(args: argparse.Namespace) -> Callable[[], None]:
    if args.cupy:
        import cupy

        return cupy.cuda.Device().synchronize
    return lambda: None


def _samples(fn: Callable[[], Any], sync: Callable[[], None], samples: int) -> list[float]:
    """Seconds per call: one warm call (plans made, kernels compiled, workers warm), then ``samples``."""
    fn()
    sync()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _task_overhead(da: Any, xp: Any, samples: int) -> float:
    """Seconds per task of this scheduler: a graph of 1000 tasks that each return their small block."""
    x = da.from_array(xp.zeros(1000, dtype=np.float32), chunks=1, asarray=False).persist()
    meta = xp.empty(0, dtype=np.float32)
    times = _samples(lambda: x.map_blocks(_noop, dtype=np.float32, meta=meta).compute(), lambda: None, samples)
    return statistics.median(times) / 1000


def _noop(block: Any) -> Any:
    return block


def _lengths(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    lengths = rng.geometric(1 / mean, size=int(n / mean * 1.2) + 16)
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, n))
    lengths = lengths[: k + 1].copy()
    lengths[-1] -= int(ends[k]) - n
    return lengths.astype(np.int64)


def _aligned(chunks: tuple[int, ...], offsets: np.ndarray) -> tuple[int, ...]:
    """The chunking whose edges are the segment edges nearest to those of ``chunks``."""
    edges = np.cumsum((0, *chunks))
    j = np.clip(np.searchsorted(offsets, edges), 1, len(offsets) - 1)
    below, above = offsets[j - 1], offsets[j]
    moved = np.where(above - edges < edges - below, above, below)
    moved = np.unique(np.concatenate([[0, edges[-1]], moved]))
    return tuple(int(c) for c in np.diff(moved))


def _single(x: Any, segments: dict[str, Any]) -> Any:
    return linred.segmented_sum(x, **segments)


def _linred_dask(array: Any, segments: dict[str, Any], method: str) -> Any:
    return linred.dask.segmented_sum(array, **segments, method=method).compute()


def _coarsen(da: Any, xp: Any, array: Any, L: int, compute: bool = True) -> Any:
    result = da.coarsen(xp.sum, array, {0: L})
    return result.compute() if compute else result


def _flox(flox: Any, array: Any, by: Any, groups: np.ndarray, compute: bool = True) -> Any:
    result = flox.groupby_reduce(array, by, func="sum", expected_groups=groups)[0]
    return result.compute() if compute else result


def _tasks(array: Any) -> int:
    return len(array.__dask_graph__())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e8, help="float32 values (default 1e8)")
    parser.add_argument("--chunks", default="3,10,200", help="numbers of chunks, comma-separated")
    parser.add_argument("--segment-length", type=int, default=1000, help="the fixed length")
    parser.add_argument("--mean-length", type=float, default=256, help="mean of the geometric lengths")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--cupy", action="store_true", help="CuPy chunks (a CUDA GPU; with --cluster: dask_cuda)")
    parser.add_argument(
        "--cluster", action="store_true", help="a distributed LocalCluster (LocalCUDACluster with --cupy)"
    )
    parser.add_argument("--json", help="write every sample here")
    args = parser.parse_args(argv)

    import dask
    import dask.array as da

    n = int(args.n)
    rng = np.random.default_rng(0)
    if args.cupy:
        import cupy

        xp = cupy
        whole = cupy.random.random(n, dtype=cupy.float32)
    else:
        xp = np
        whole = rng.random(n, dtype=np.float32)
    sync = _sync(args)
    client = None
    if args.cluster:
        from distributed import Client

        if args.cupy:
            from dask_cuda import LocalCUDACluster

            cluster = LocalCUDACluster()
        else:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
    try:
        flox = __import__("flox")
    except ImportError:
        flox = None
    scheduler = "distributed" if client else dask.config.get("scheduler", "threads")
    overhead = _task_overhead(da, xp, args.samples)
    print(
        f"linred {linred.__version__}, dask {dask.__version__}, {'CuPy' if args.cupy else 'NumPy'} chunks, "
        f"scheduler {scheduler}, n = {n:,} float32; per task of the scheduler: {overhead * 1e6:.0f} us",
        flush=True,
    )
    rows = []
    fixed_n = n - n % args.segment_length
    layouts = {
        f"fixed L={args.segment_length}": (fixed_n, {"segment_length": args.segment_length}),
        f"geometric mean {args.mean_length:g}": (n, {"lengths": _lengths(rng, n, args.mean_length)}),
    }
    for layout, (size, segments) in layouts.items():
        x = whole[:size]
        if "lengths" in segments:
            offsets = np.concatenate([[0], np.cumsum(segments["lengths"])])
            labels = np.repeat(np.arange(len(segments["lengths"]), dtype=np.int32), segments["lengths"])
        else:
            L = segments["segment_length"]
            offsets = np.arange(0, size + 1, L, dtype=np.int64)
            labels = np.arange(size, dtype=np.int64) // L
        labels = labels.astype(np.int32)
        for k in (int(c) for c in args.chunks.split(",")):
            regular = max(1, -(-size // k))
            regular_chunks = (regular,) * (size // regular) + ((size % regular,) if size % regular else ())
            aligned_chunks = _aligned(regular_chunks, offsets)
            on_regular = da.from_array(x, chunks=(regular_chunks,), asarray=False).persist()
            on_aligned = da.from_array(x, chunks=(aligned_chunks,), asarray=False).persist()
            if client is not None:
                from distributed import wait

                wait([on_regular, on_aligned])
            cases: list[tuple[str, Callable[[], Any], Any]] = [("single", partial(_single, x, segments), None)]
            for method, array in (("blockwise", on_aligned), ("carry", on_regular), ("rechunk", on_regular)):
                graph = linred.dask.segmented_sum(array, **segments, method=method)
                cases.append((method, partial(_linred_dask, array, segments, method), graph))
            if "segment_length" in segments:
                cases.append(
                    ("da.coarsen", partial(_coarsen, da, xp, on_aligned, L), _coarsen(da, xp, on_aligned, L, False))
                )
            if flox is not None and not args.cupy:
                by = da.from_array(labels, chunks=(regular_chunks,))
                groups = np.arange(int(labels[-1]) + 1 if size else 0)
                cases.append(
                    ("flox", partial(_flox, flox, on_regular, by, groups), _flox(flox, on_regular, by, groups, False))
                )
            base = None
            for name, fn, graph in cases:
                times = _samples(fn, sync, args.samples)
                med = statistics.median(times)
                base = base or med
                tasks = _tasks(graph) if graph is not None else 0
                share = tasks * overhead / med if tasks else 0.0
                rows.append({"layout": layout, "chunks": k, "method": name, "median_s": med, "samples_s": times,
                             "tasks": tasks, "overhead_share": share})  # fmt: skip
                print(
                    f"{layout:22s} {k:4d} chunks  {name:10s} {med * 1e3:9.2f} ms  [{min(times) * 1e3:9.2f}, "
                    f"{max(times) * 1e3:9.2f}]  {med / base:5.2f}x single  {tasks:6d} tasks  "
                    f"~{100 * share:5.1f}% per-task overhead",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "scheduler": scheduler, "task_overhead_s": overhead, "rows": rows}, f, indent=1)
    if client is not None:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
