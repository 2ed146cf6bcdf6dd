"""Per-call time of small calls: linred's call forms against the library idioms they replace.

Small calls are where a Python pipeline shows: the data is a few kilobytes, so the
time is the call itself.  Every row is timed in this process, on the same arrays,
warm, as ``samples`` means of ``number`` back-to-back calls (each followed by a
device synchronization on the GPU), the rows of a group interleaved sample by
sample; each is reported as the median with the min and max of its samples, and
ratios are of medians in the same run.

    python tools/call_overhead.py            # CPU (NumPy, and torch CPU if installed)
    python tools/call_overhead.py --gpu      # CuPy and torch CUDA too
    python tools/call_overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import linred


def _batch(fn: Callable[[], Any], sync: Callable[[], Any], number: int) -> float:
    """Microseconds per call of ``number`` back-to-back calls, each followed by ``sync``."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
        sync()
    return (time.perf_counter() - t0) / number * 1e6


def _time_group(rows: list[tuple[Any, ...]], number: int, samples: int) -> list[list[float]]:
    """The samples of each row of one group, the rows interleaved sample by sample, so that a
    change of the machine's state (another process, clocks) falls on every row alike."""
    for _, _, fn, sync in rows:
        _batch(fn, sync, max(3, number // 10))  # warm: plans made, kernels compiled, caches filled
    times: list[list[float]] = [[] for _ in rows]
    for _ in range(samples):
        for i, (_, _, fn, sync) in enumerate(rows):
            times[i].append(_batch(fn, sync, number))
    return times


def _cpu_rows() -> list[tuple[str, str, Callable[[], Any]]]:
    x = np.random.default_rng(0).random(1024, dtype=np.float32)
    out = np.empty(32, np.float32)
    offs = np.arange(0, 1025, 32)
    plan = linred.SegmentedReduction(x, 32)
    L64 = np.int64(32)  # made once: the row times linred's handling of it, not NumPy's scalar constructor
    base = "numpy reshape(32, 32).sum(1, out=)"
    return [
        ("cpu 1024 float32", base, lambda: x.reshape(32, 32).sum(1, out=out)),
        ("cpu 1024 float32", "segmented_sum(x, 32, out=)", lambda: linred.segmented_sum(x, 32, out=out)),
        ("cpu 1024 float32", "segmented_sum(x, np.int64(32), out=)", lambda: linred.segmented_sum(x, L64, out=out)),
        ("cpu 1024 float32", "segmented_sum(x, 32, dtype='float32', out=)", lambda: linred.segmented_sum(x, 32, dtype="float32", out=out)),
        ("cpu 1024 float32", "segmented_sum(x, offsets=, check=False, out=)", lambda: linred.segmented_sum(x, offsets=offs, check=False, out=out)),
        ("cpu 1024 float32", "segmented_sum(x, offsets=, out=)", lambda: linred.segmented_sum(x, offsets=offs, out=out)),
        ("cpu 1024 float32", "SegmentedReduction(x, 32)(x, out=)", lambda: plan(x, out=out)),
    ]  # fmt: skip


def _gpu_rows() -> list[tuple[str, str, Callable[[], Any], Callable[[], Any]]]:
    rows = []
    import cupy
    import torch

    n, L, m = 1 << 16, 256, 256
    cx = cupy.random.random(n, dtype=cupy.float32)
    tx = torch.rand(n, device="cuda")
    t_off = torch.linspace(0, n, m + 1, device="cuda").long()
    c_off = cupy.asarray(t_off)
    cupy_sync = cupy.cuda.get_current_stream().synchronize
    torch_sync = torch.cuda.synchronize
    c_plan = linred.SegmentedReduction(cx, L)
    t_plan = linred.SegmentedReduction(tx, L)
    g = f"n=2^16 L={L}"
    rows += [
        (f"cupy {g}", "cupy x.reshape(-1, L).sum(1)", lambda: cx.reshape(-1, L).sum(1), cupy_sync),
        (f"cupy {g}", "segmented_sum(x, L)", lambda: linred.segmented_sum(cx, L), cupy_sync),
        (f"cupy {g}", "SegmentedReduction(x, L)(x)", lambda: c_plan(cx), cupy_sync),
        (f"torch {g}", "torch.sum(x.view(-1, L), 1)", lambda: torch.sum(tx.view(-1, L), 1), torch_sync),
        (f"torch {g}", "segmented_sum(x, L)", lambda: linred.segmented_sum(tx, L), torch_sync),
        (f"torch {g}", "SegmentedReduction(x, L)(x)", lambda: t_plan(tx), torch_sync),
    ]
    o = f"n=2^16 m={m} offsets"
    rows += [
        (f"torch {o}", "torch.segment_reduce(x, 'sum', offsets=)", lambda: torch.segment_reduce(tx, "sum", offsets=t_off), torch_sync),
        (f"torch {o}", "segmented_sum(x, offsets=, check=False)", lambda: linred.segmented_sum(tx, offsets=t_off, check=False), torch_sync),
        (f"torch {o}", "segmented_sum(x, offsets=)", lambda: linred.segmented_sum(tx, offsets=t_off), torch_sync),
        (f"cupy {o}", "segmented_sum(x, offsets=, check=False)", lambda: linred.segmented_sum(cx, offsets=c_off, check=False), cupy_sync),
    ]  # fmt: skip
    for N, d, graphs in ((2000, 64, 32), (50000, 128, 256)):
        feats = torch.rand(N, d, device="cuda")
        ptr = torch.linspace(0, N, graphs + 1, device="cuda").long()
        label = f"torch GNN {N}x{d}, {graphs} graphs"
        rows += [
            (label, "torch.segment_reduce(x, 'sum', offsets=ptr)", lambda f=feats, p=ptr: torch.segment_reduce(f, "sum", offsets=p), torch_sync),
            (label, "index_add_", lambda f=feats, p=ptr, g=graphs: torch.zeros(g, f.shape[1], device="cuda").index_add_(0, torch.repeat_interleave(torch.arange(g, device="cuda"), p.diff()), f), torch_sync),
            (label, "segmented_sum(x, offsets=ptr, check=False)", lambda f=feats, p=ptr: linred.segmented_sum(f, offsets=p, check=False), torch_sync),
            (label, "segmented_sum(x, offsets=ptr)", lambda f=feats, p=ptr: linred.segmented_sum(f, offsets=p), torch_sync),
        ]  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="also time CuPy and torch CUDA calls")
    parser.add_argument("--number", type=int, default=2000, help="calls per sample on the CPU (GPU: a tenth)")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--json", help="write every sample here")
    args = parser.parse_args(argv)
    rows = [(*r, lambda: None) for r in _cpu_rows()]
    if args.gpu:
        rows += _gpu_rows()
    results = []
    groups: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault(row[0], []).append(row)
    for group, members in groups.items():
        number = args.number if group.startswith("cpu") else max(10, args.number // 10)
        times = _time_group(members, number, args.samples)
        base = statistics.median(times[0])
        for (_, name, _, _), samples in zip(members, times, strict=True):
            med = statistics.median(samples)
            results.append({"group": group, "call": name, "median_us": med, "samples_us": samples})
            print(
                f"{group:34s} {name:48s} {med:8.2f} us  [{min(samples):7.2f}, {max(samples):7.2f}]  "
                f"{med / base:5.2f}x the first row",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
