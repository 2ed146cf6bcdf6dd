"""Measure linred and the peers on your own shape.

``linred bench`` times a fixed set of shapes.  For yours, describe it as a
``linred.bench.cases.Case`` and hand it to the same runner: every linred backend
and every peer (NumPy on the CPU; CuPy, PyTorch, cuda.compute and cuSPARSE on
the GPU) is checked against float64 and timed on the same buffer, beside a copy
of that buffer as the bandwidth ceiling.  The second part times one call of your
own with the same clocks (CUDA events on the GPU, ``perf_counter`` on the CPU).

The defaults are small so that the script runs in seconds; use sizes far larger
than the caches for figures that mean something (the GPU default of
``linred bench`` is 2^28 float32, 1 GiB).

Run: python examples/bench_my_shape.py [--n 2^20] [--length 32 | --mean 16] [--features 1]
     [--dtype float32] [--device auto|cpu|gpu] [--methods linred,numpy]
"""

import argparse
import sys

import numpy as np

import linred
from linred.bench.cases import Case
from linred.bench.meta import gpu_available
from linred.bench.report import format_table
from linred.bench.runner import Settings, run_cases
from linred.bench.timing import gbps, time_device, time_host


def count(text):
    """An element count: 1048576, 2^20 or 2**20."""
    text = text.replace("**", "^")
    return 1 << int(text[2:]) if text.startswith("2^") else int(text)


parser = argparse.ArgumentParser(description="Time linred and the peers on one shape of yours.")
parser.add_argument("--n", type=count, default=1 << 20, help="elements along the segment axis (default 2^20)")
shape = parser.add_mutually_exclusive_group()
shape.add_argument("--length", type=int, help="fixed segment length L (default 32)")
shape.add_argument("--mean", type=float, help="variable lengths: geometric with this mean, as offsets")
parser.add_argument("--features", type=int, default=1, help="values per element: the array is (n, features)")
parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
parser.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
parser.add_argument("--methods", help="comma-separated substrings of method names, e.g. 'linred,torch'")
parser.add_argument("--repeats", type=int, default=7, help="timed samples per method (default 7)")
args = parser.parse_args()

on_gpu, why = gpu_available()
device = "gpu" if args.device == "gpu" or (args.device == "auto" and on_gpu) else "cpu"
if device == "gpu" and not on_gpu:
    sys.exit(f"--device gpu, but {why}")
if device == "cpu" and args.dtype == "bfloat16":
    sys.exit("bfloat16 data is measured on the GPU only (as CUDA PyTorch tensors)")

# --- 1. your shape through the runner of `linred bench`
if args.mean is not None:
    case = Case("my shape", "variable", args.dtype, args.n, features=args.features, layout="geometric", mean=args.mean)
else:
    length = args.length or 32
    if args.n % length:
        sys.exit(f"--length {length} must divide --n {args.n}")
    case = Case("my shape", "fixed", args.dtype, args.n, features=args.features, length=length)
print(f"{case.describe()} on the {device.upper()}{'' if device == 'gpu' else f' ({why})' if why else ''}")

settings = Settings(device=device, warmup=2, repeats=args.repeats, budget_s=0.5, methods=args.methods)
(result,) = run_cases([case], settings)
print(format_table([result]))
if result.status != "ok":
    sys.exit(f"FAILED: the case could not run: {result.note}")
broken = [m for m in result.methods if m.kind == "linred" and m.status in ("WRONG", "error")]
for m in broken:
    print(f"FAILED: {m.name}: {m.status}: {m.note}")
auto = result.method("linred auto")
best = result.best_peer()
if auto is not None and auto.ok and best is not None:
    # faster or slower only when the [min, max] intervals of the samples do not overlap
    print(
        f"linred auto: {auto.gbps:.1f} GB/s; best peer {best.name}: {best.gbps:.1f} GB/s "
        f"(medians; by their [min, max] intervals linred auto is {result.auto_verdict()})"
    )

# --- 2. one call of your own, timed with the same clocks
if device == "gpu":
    import cupy as xp
else:
    xp = np
if args.dtype in ("float32", "float64"):
    host = np.random.default_rng(0).standard_normal(case.shape, dtype=args.dtype)
    x = xp.asarray(host)
    segments = {"offsets": xp.asarray(case.offsets())} if args.mean is not None else {"segment_length": case.length}
    call = lambda: linred.segmented_sum(x, **segments)
    if device == "gpu":
        timing = time_device(call, lib="cupy", warmup=2, repeats=args.repeats, budget_s=0.5)
    else:
        timing = time_host(call, warmup=2, repeats=args.repeats, budget_s=0.5)
    got = np.asarray(xp.asnumpy(timing.last) if device == "gpu" else timing.last, dtype=np.float64)
    x64 = host.astype(np.float64)
    if args.mean is None:
        reference = x64.reshape(case.n // case.length, case.length, *case.shape[1:]).sum(axis=1)
    else:
        prefix = np.concatenate([np.zeros((1, *case.shape[1:])), np.cumsum(x64, axis=0)])
        offsets = case.offsets()
        reference = prefix[offsets[1:]] - prefix[offsets[:-1]]
    error = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
    nbytes = host.nbytes + got.size * host.itemsize + (0 if args.mean is None else case.offsets().nbytes)
    print(
        f"your call, linred.segmented_sum(x, {', '.join(segments)}=...): {timing.seconds * 1e3:.3f} ms "
        f"[{min(timing.samples) * 1e3:.3f}, {max(timing.samples) * 1e3:.3f}] over {len(timing.samples)} samples "
        f"({timing.calls} calls per sample), {gbps(nbytes, timing.seconds):.1f} GB/s, "
        f"relative error against float64 {error:.1e}"
    )
    if not error <= (1e-5 if args.dtype == "float32" else 1e-12):
        broken.append("your call")
        print("FAILED: your call's result differs from float64")

if broken:
    sys.exit(1)
print("OK: bench_my_shape")
