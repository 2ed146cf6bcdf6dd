"""Plans: prepare a segmented reduction once, run it on many arrays of the same layout.

``linred.SegmentedReduction`` is built from an example array (type, shape, strides,
dtype, device), the segments, the reduction and the backend.  The functions
(``linred.segmented_sum`` ...) keep such plans in a bounded cache too, so a loop
of calls on same-shaped data plans once.

Run: python examples/plans.py
"""

import itertools

import numpy as np

import linred

rng = np.random.default_rng(0)
batch = rng.random((8, 1 << 12), dtype=np.float32)  # 8 signals of 4096 samples

# One plan, many calls: windowed means of 64 samples over each signal.
with linred.SegmentedReduction(batch[0], 64, reduction="mean") as plan:
    print("plan:", plan)
    print("served by backend:", plan.backend, "| result shape", plan.out_shape, plan.out_dtype)
    out = np.empty(plan.out_shape, dtype=plan.out_dtype)
    for signal in batch:
        assert plan(signal, out=out) is out
        np.testing.assert_allclose(out, signal.reshape(-1, 64).mean(axis=1), rtol=1e-5)
# Leaving the with-block freed the plan's resources; it cannot run any more.

# Variable-length segments bound to a plan are validated once, when it is built.
offsets = np.array([0, 100, 100, 1000, 4096])
with linred.SegmentedReduction(batch[0], offsets=offsets, reduction="sum") as plan:
    for signal in batch:
        expected = [signal[a:b].astype(np.float64).sum() for a, b in itertools.pairwise(offsets)]
        np.testing.assert_allclose(plan(signal), expected, rtol=1e-5)

# The functions' plan cache: the second call with the same layout is a hit.
linred.clear_plan_cache()
linred.segmented_sum(batch[0], 64)
linred.segmented_sum(batch[1], 64)
info = linred.plan_cache_info()
print("plan cache:", info)
assert info["misses"] >= 1 and info["hits"] >= 1

# check=False skips validating offsets: the caller promises they are valid
# (non-decreasing, starting at 0, ending at n); invalid ones give undefined results.
trusted = linred.segmented_sum(batch[0], offsets=offsets, check=False)
np.testing.assert_allclose(trusted, linred.segmented_sum(batch[0], offsets=offsets), rtol=1e-6)

# A backend named explicitly either serves the call or says why not: no silent fallback.
try:
    linred.segmented_sum(batch[0], 64, backend="cublas")
except linred.BackendError as e:
    print("backend='cublas' on a NumPy array:", e.reason)

print("OK: plans")
