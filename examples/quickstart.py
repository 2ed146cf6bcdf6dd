"""Quick start: the seed example, [1..12] in 3 segments of 4 -> [10, 26, 42], with each way of naming segments.

Run: python examples/quickstart.py
"""

import numpy as np

import linred

x = np.arange(1, 13, dtype=np.float32)

# Three equivalent ways to name the same three segments.
by_length = linred.segmented_sum(x, 4)  # fixed length: x viewed as a (3, 4) matrix times ones(4)
by_offsets = linred.segmented_sum(x, offsets=[0, 4, 8, 12])  # CSR-style boundaries
by_lengths = linred.segmented_sum(x, lengths=[4, 4, 4])
print("segmented_sum(x, 4)                      ->", by_length)
print("segmented_sum(x, offsets=[0, 4, 8, 12])  ->", by_offsets)
print("segmented_sum(x, lengths=[4, 4, 4])      ->", by_lengths)
for result in (by_length, by_offsets, by_lengths):
    np.testing.assert_array_equal(result, [10, 26, 42])
    assert result.dtype == np.float32

# The other reductions, and an empty segment (sum 0, mean NaN, max -inf, min +inf).
offsets = [0, 4, 4, 12]
print("segmented_mean(x, 4)                     ->", linred.segmented_mean(x, 4))
print("segmented_max(x, offsets=[0, 4, 4, 12])  ->", linred.segmented_max(x, offsets=offsets))
print("segmented_min(x, offsets=[0, 4, 4, 12])  ->", linred.segmented_min(x, offsets=offsets))
np.testing.assert_array_equal(linred.segmented_sum(x, offsets=offsets), [10, 0, 68])
np.testing.assert_array_equal(linred.segmented_mean(x, 4), [2.5, 6.5, 10.5])
np.testing.assert_array_equal(linred.segmented_max(x, offsets=offsets), [4, -np.inf, 12])
np.testing.assert_array_equal(linred.segmented_min(x, offsets=offsets), [1, np.inf, 5])

# Feature dimensions are carried: 12 rows of 2 features -> 3 rows of 2.
xd = np.stack([x, -x], axis=1)  # shape (12, 2)
print("segmented_sum(x2d, 4)                    ->", linred.segmented_sum(xd, 4).tolist())
np.testing.assert_array_equal(linred.segmented_sum(xd, 4), [[10, -10], [26, -26], [42, -42]])

# Segments along another axis: each row of a (2, 12) array split into 3 segments.
rows = np.stack([x, 2 * x])
np.testing.assert_array_equal(linred.segmented_sum(rows, 4, axis=-1), [[10, 26, 42], [20, 52, 84]])

# Integers sum into int64; out= fills a preallocated result and returns it.
ints = np.arange(1, 13, dtype=np.int32)
out = np.empty(3, dtype=np.int64)
assert linred.segmented_sum(ints, 4, out=out) is out
np.testing.assert_array_equal(out, [10, 26, 42])

print("OK: quickstart")
