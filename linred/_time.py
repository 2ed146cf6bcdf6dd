"""Segmented reductions of NumPy ``datetime64`` and ``timedelta64`` data.

The durations and timestamps of a time series are int64 counts of a unit, so they are
reduced as int64 through the same functions, and the results are given back their unit:

- ``segmented_sum`` of timedelta64: the total duration (the sum of timestamps is undefined
  and raises ``TypeError``); an empty segment sums to 0;
- ``segmented_mean`` of either: the mean as an offset from the smallest value of the array,
  summed exactly in int64 and divided with an integer remainder, rounded to the nearest unit
  (ties to even): no float64 rounding of large timestamps (2^53 ns is 104 days);
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
        valid = ints[~nat]
        reference = int(valid.min()) if valid.size else 0
        clean = np.where(nat, 0, ints - reference) if any_nat else ints - reference
        sums = linred.segmented_sum(clean, **common)
        counts = linred.segmented_sum(np.ones_like(ints, dtype=np.int8), **common)
        safe = np.maximum(counts, 1)
        quotient, rest = np.divmod(sums, safe)  # exact in int64 (floor division: rest >= 0)
        up = (2 * rest > safe) | ((2 * rest == safe) & ((reference + quotient) % 2 == 1))  # ties to even
        result = np.where(counts == 0, _NAT, reference + quotient + up)
    if any_nat:
        result = np.where(nat_in, _NAT, result)
    return np.asarray(result, dtype=np.int64).view(x.dtype.newbyteorder("="))
