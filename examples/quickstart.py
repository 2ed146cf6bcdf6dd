"""Quick start: [1..12] in three segments of four -> [10, 26, 42], with each way of naming segments.

Runs on the GPU (CuPy arrays) when a CUDA device is usable, else on the CPU
(NumPy arrays); the results are checked against plain Python sums.

Run: python examples/quickstart.py
"""

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
print(f"arrays: {xp.__name__}")
failures = []


def check(label, result, expected):
    """Print a result and compare it with the expected values (exactly: these sums are small integers)."""
    got = to_numpy(result)
    ok = got.shape == np.shape(expected) and bool(np.all(got == np.asarray(expected)))
    print(f"{label:<44} -> {got.tolist()}{'' if ok else f'   MISMATCH, expected {expected}'}")
    if not ok:
        failures.append(label)


values = list(range(1, 13))
x = xp.asarray(values, dtype=xp.float32)
expected = [sum(values[i : i + 4]) for i in range(0, 12, 4)]  # the reference: a Python loop

# Three equivalent ways to name the same three segments.
check("segmented_sum(x, 4)", linred.segmented_sum(x, 4), expected)  # fixed length: x as a (3, 4) matrix
check("segmented_sum(x, offsets=[0, 4, 8, 12])", linred.segmented_sum(x, offsets=[0, 4, 8, 12]), expected)
check("segmented_sum(x, lengths=[4, 4, 4])", linred.segmented_sum(x, lengths=[4, 4, 4]), expected)
if linred.segmented_sum(x, 4).dtype != np.float32:
    failures.append("float32 in must give float32 out")

# The other reductions, and an empty segment: sum 0, mean NaN, max -inf, min +inf.
offsets = [0, 4, 4, 12]
check("segmented_mean(x, 4)", linred.segmented_mean(x, 4), [s / 4 for s in expected])
check("segmented_sum(x, offsets=[0, 4, 4, 12])", linred.segmented_sum(x, offsets=offsets), [10, 0, 68])
check("segmented_max(x, offsets=[0, 4, 4, 12])", linred.segmented_max(x, offsets=offsets), [4, -np.inf, 12])
check("segmented_min(x, offsets=[0, 4, 4, 12])", linred.segmented_min(x, offsets=offsets), [1, np.inf, 5])
empty_mean = to_numpy(linred.segmented_mean(x, offsets=offsets))[1]
print(f"{'segmented_mean(...)[1] of the empty segment':<44} -> {empty_mean}")
if not np.isnan(empty_mean):
    failures.append("the mean of an empty segment must be NaN")

# Feature dimensions are carried: 12 rows of 2 features -> 3 rows of 2.
x2 = xp.stack([x, -x], axis=1)
check("segmented_sum(x2 (12, 2), 4)", linred.segmented_sum(x2, 4), [[s, -s] for s in expected])

# Segments along another axis: each row of a (2, 12) array split into 3 segments.
rows = xp.stack([x, 2 * x])
check(
    "segmented_sum(rows (2, 12), 4, axis=-1)",
    linred.segmented_sum(rows, 4, axis=-1),
    [expected, [2 * s for s in expected]],
)

# Integers sum into int64; out= fills a preallocated result and returns it.
ints = xp.arange(1, 13, dtype=xp.int32)
out = xp.empty(3, dtype=xp.int64)
result = linred.segmented_sum(ints, 4, out=out)
check("segmented_sum(int32, 4, out=int64 array)", result, expected)
if result is not out:
    failures.append("out= must be returned")

if failures:
    print("FAILED:", "; ".join(failures))
    sys.exit(1)
print("OK: quickstart")
