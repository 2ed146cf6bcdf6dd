"""Segmented reductions of NumPy ``datetime64`` and ``timedelta64`` data.

The durations and timestamps of a time series are int64 counts of a unit, so they are
reduced as int64 through the same functions, and the results are given back their unit:

- ``segmented_sum`` of timedelta64: the total duration (the sum of timestamps is undefined
  and raises ``TypeError``); an empty segment sums to 0;
- ``segmented_mean`` of either: the mean as an offset from the smallest value of the array,
  summed exactly (as two uint64 parts) and divided with an integer remainder, rounded to the
  nearest unit (ties to even): no float64 rounding of large timestamps (2^53 ns is 104 days),
  and no wrap-around of a sum past 2^63 ns (292 years);
- ``segmented_max`` / ``segmented_min``: the latest / earliest value.

As NumPy's reductions do, a segment holding ``NaT`` gives ``NaT``, and so does an empty
segment (except a sum).  Host (NumPy) data only: no other array library has these dtypes.
Each call makes a few passes over the data (the values, the NaT mask, the lengths);
``dtype=``, ``out=`` and ``stream=`` are not supported for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["is_time", "reduce_time"]

_NAT = np.iinfo(np.int64).min


def is_time(x: Any) -> bool:
    """Whether ``x`` is a NumPy array of datetime64 or timedelta64 values."""
    return isinstance(x, np.ndarray) and x.dtype.kind in "mM"


def reduce_time(reduction: str, x: np.ndarray, segments: dict[str, Any], axis: Any, backend: Any, check: Any) -> Any:
    """``segmented_<reduction>`` of datetime64/timedelta64 ``x`` (see the module's docstring)."""
    import linred

    kind = x.dtype.kind
    if reduction == "sum" and kind == "M":
        raise TypeError(f"the sum of x's {x.dtype} values is undefined; reduce x - a reference timestamp (timedelta64)")
    if reduction not in ("sum", "mean", "max", "min"):
        raise TypeError(f"segmented_{reduction} does not take {x.dtype} data")
    common = {**segments, "axis": axis, "backend": backend, "check": check}
    ints = x.view(np.dtype(np.int64).newbyteorder(x.dtype.byteorder))
    nat = np.isnat(x)
    any_nat = bool(nat.any())
    # Per segment: does it hold a NaT, and how many elements does it have?
    nat_in = linred.segmented_max(nat, **common) if any_nat else None
    if reduction in ("max", "min"):
        # NaT is the smallest int64: a max leaves it out, a min would pick it (both give NaT below).
        values = linred.segmented_max(ints, **common) if reduction == "max" else linred.segmented_min(ints, **common)
        empty = linred.segmented_sum(np.ones_like(ints, dtype=np.int8), **common) == 0
        result = np.where(empty, _NAT, values)
    elif reduction == "sum":
        clean = np.where(nat, 0, ints) if any_nat else ints
        result = linred.segmented_sum(clean, **common)
    else:
        result = _mean(ints, nat, any_nat, common)
    if any_nat:
        result = np.where(nat_in, _NAT, result)
    return np.asarray(result, dtype=np.int64).view(x.dtype.newbyteorder("="))


#: bits of an offset's low part in the mean (_mean): its parts' sums stay exact in uint64 for
#: segments of fewer than 2**31 elements
_LOW = 31


def _mean(ints: np.ndarray, nat: np.ndarray, any_nat: bool, common: dict[str, Any]) -> np.ndarray:
    """The mean of each segment of int64 ``ints`` (NaT left out by the caller), rounded to the
    nearest unit (ties to even), exactly: each value as its offset d from the array's smallest,
    a uint64 (a timestamp range may span all of int64), cut into d = hi 2**31 + lo, whose sums
    cannot wrap (a sum of offsets in int64 wrapped past 2**63 ns, 292 years: 120,000 timestamps a
    day apart), then divided in two steps: hi's sum by the count, then its remainder joined to
    lo's sum.  Segments of 2**31 elements or more are divided as Python integers."""
    import linred

    valid = ints[~nat]
    reference = int(valid.min()) if valid.size else 0
    u64 = np.dtype(np.uint64)
    # (ints >= reference where not NaT: the difference, taken modulo 2**64, is exact)
    d = ints.astype(u64) - np.uint64(reference % 2**64)
    if any_nat:
        d[nat] = 0
    low = d & np.uint64(2**_LOW - 1)
    high = d >> np.uint64(_LOW)
    s_low = np.asarray(linred.segmented_sum(low, **common), dtype=u64)
    s_high = np.asarray(linred.segmented_sum(high, **common), dtype=u64)
    counts = np.asarray(linred.segmented_sum(np.ones_like(ints, dtype=np.int8), **common), dtype=np.int64)
    safe = np.maximum(counts, 1).astype(u64)
    if counts.max(initial=0) < 2**31:
        q1, r1 = np.divmod(s_high, safe)  # the high sums: q1 c + r1
        q2, rest = np.divmod((r1 << np.uint64(_LOW)) + s_low, safe)  # (r1 2**31 + s_low < 2**64)
        quotient = (q1 << np.uint64(_LOW)) + q2  # (at most the largest offset: below 2**64)
    else:  # (exact in Python integers, segment by segment)
        parts = zip(s_high.ravel(), s_low.ravel(), safe.ravel(), strict=True)
        pairs = [divmod((int(h) << _LOW) + int(lo), int(c)) for h, lo, c in parts]
        quotient = np.array([q for q, _ in pairs], dtype=u64).reshape(safe.shape)
        rest = np.array([r for _, r in pairs], dtype=u64).reshape(safe.shape)
    mean = (quotient + np.uint64(reference % 2**64)).view(np.int64)  # (within the segment's range: an int64)
    up = (2 * rest > safe) | ((2 * rest == safe) & (mean % 2 == 1))  # ties to even  (2 rest < 2**32 here)
    return np.where(counts == 0, _NAT, mean + up)
