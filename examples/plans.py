"""Plans: prepare a segmented reduction once, run it on many arrays of the same layout.

``linred.SegmentedReduction`` is built from an example array (type, shape, strides,
dtype, device), the segments, the reduction and the backend.  The functions
(``linred.segmented_sum`` ...) keep such plans in a bounded cache too, so a loop
of calls on same-shaped data plans once.  Runs on the GPU (CuPy arrays) when a
CUDA device is usable, else on the CPU; checked against float64 NumPy.

Run: python examples/plans.py
"""

import itertools
import sys

import numpy as np

import linred


def array_module():
    """CuPy when a CUDA device is usable, else NumPy."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # CuPy missing, no driver, no device
        pass
    return np


xp = array_module()
to_numpy = getattr(xp, "asnumpy", np.asarray)
failures = []


def check(label, ok):
    if not ok:
        print(f"  MISMATCH: {label}")
        failures.append(label)


host = np.random.default_rng(0).random((8, 1 << 12), dtype=np.float32)  # 8 signals of 4096 samples
batch = xp.asarray(host)
print(f"arrays: {xp.__name__}")

# One plan, many calls: windowed means of 64 samples over each signal.
with linred.SegmentedReduction(batch[0], 64, reduction="mean") as plan:
    print("plan:", plan)
    print("served by backend:", plan.backend, "| result shape", plan.out_shape, plan.out_dtype)
    out = xp.empty(plan.out_shape, dtype=plan.out_dtype)
    for i, signal in enumerate(batch):
        returned = plan(signal, out=out)
        reference = host[i].astype(np.float64).reshape(-1, 64).mean(axis=1)
        close = np.allclose(to_numpy(out), reference, rtol=1e-5)
        check(f"signal {i}: plan(signal, out=out) returns out, windowed means match", returned is out and close)
    print(f"windowed means of {len(batch)} signals through one plan, checked against float64")
# Leaving the with-block freed the plan's resources; it cannot run any more.

# Variable-length segments bound to a plan are validated once, when it is built.
offsets = [0, 100, 100, 1000, 4096]
with linred.SegmentedReduction(batch[0], offsets=offsets, reduction="sum") as plan:
    for i, signal in enumerate(batch):
        expected = [host[i, a:b].astype(np.float64).sum() for a, b in itertools.pairwise(offsets)]
        check(f"signal {i}: sums over offsets {offsets}", np.allclose(to_numpy(plan(signal)), expected, rtol=1e-5))
    print(f"sums over offsets {offsets} of {len(batch)} signals through one plan, checked against float64")

# The functions' plan cache: the second call with the same layout is a hit.
linred.clear_plan_cache()
linred.segmented_sum(batch[0], 64)
linred.segmented_sum(batch[1], 64)
info = linred.plan_cache_info()
print("plan cache:", info)
check("second call with the same layout hits the cache", info["misses"] >= 1 and info["hits"] >= 1)

# check=False skips validating offsets: the caller promises they are valid
# (non-decreasing, starting at 0, ending at n); invalid ones give undefined results.
trusted = linred.segmented_sum(batch[0], offsets=offsets, check=False)
checked = linred.segmented_sum(batch[0], offsets=offsets)
check("check=False gives the same sums for valid offsets", np.allclose(to_numpy(trusted), to_numpy(checked), rtol=1e-6))

# A backend named explicitly either serves the call or says why not: no silent fallback.
try:
    linred.segmented_sum(batch[0], 64, backend="cublas")
    print(f"backend='cublas' serves {xp.__name__} arrays")
except linred.BackendError as e:
    print(f"backend='cublas' on a {xp.__name__} array: refused: {e.reason}")

if failures:
    print("FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("OK: plans")
