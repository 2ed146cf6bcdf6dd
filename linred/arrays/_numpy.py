"""The NumPy adapter (host arrays)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from linred._dtypes import dtype_name, numpy_dtype
from linred.arrays._base import ArrayAdapter, ArrayInfo, adapters


def refuse_huge_integers(a: np.ndarray, name: str) -> np.ndarray:
    """``a`` (an object array) as int64 where it holds Python integers that fit (an object array
    made of a list, as a list is taken); ValueError where one does not: NumPy keeps integers
    beyond int64 and uint64 as objects, and such a value is out of range, not of the wrong type
    (as a uint64 array's values beyond int64 are).  Anything else comes back as it is."""
    if a.size and all(type(v) is int for v in a.flat):
        beyond = next((v for v in a.flat if not -(2**63) <= v < 2**63), None)
        if beyond is not None:
            raise ValueError(f"{name} must fit in int64; got {beyond}")
        return a.astype(np.int64)
    return a


def refuse_dask(obj: Any, name: str) -> None:
    """Raise where the segment argument ``obj`` is a Dask array and x is not: converting it would
    compute its graph behind the caller's back."""
    if type(obj).__module__.partition(".")[0] == "dask":
        raise TypeError(
            f"{name} is a Dask array but x is not: pass {name}.compute(), or x as a Dask array (whose "
            "functions read the segments when they build the graph)"
        )


def _int_array(xp: Any, obj: Any, name: str, **asarray_kwargs: Any) -> Any:
    """Shared by the NumPy and CuPy adapters: ``obj`` as an int32/int64 array (a Dask array is
    refused: converting it would compute its graph behind the caller's back)."""
    refuse_dask(obj, name)
    try:
        a = xp.asarray(obj, **asarray_kwargs)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array of integers; got {type(obj).__name__} ({e})") from None
    if a.size == 0 and not hasattr(obj, "dtype"):  # NumPy makes float64 of an empty list
        a = a.astype(xp.int64)
    kind = a.dtype.kind
    if kind == "f" and isinstance(obj, (list, tuple)):
        # (NumPy makes float64 of a list whose integers pass int64 but fit uint64: read as the
        # Python integers they are, refused as out of range)
        as_objects = np.asarray(obj, dtype=object)
        if as_objects.size and all(type(v) is int for v in as_objects.flat):
            a = refuse_huge_integers(as_objects, name)
            kind = a.dtype.kind
    if kind == "O":
        a = refuse_huge_integers(a, name)
        kind = a.dtype.kind
    if kind == "b" or kind not in "iu":
        raise TypeError(f"{name} must be an array of integers; got dtype {a.dtype}")
    if a.dtype.name not in ("int32", "int64"):
        if (
            xp is np
            and a.dtype.kind == "u"
            and a.dtype.itemsize == 8
            and a.size
            and int(a.max()) > np.iinfo(np.int64).max
        ):
            # (device arrays: the wrapped, negative values fail the checks of check=True)
            raise ValueError(f"{name} must fit in int64; got {int(a.max())}")
        a = a.astype(xp.int64)
    return a


def _offsets_summary(xp: Any, off: Any) -> tuple[int, int, int, int, int]:
    if off.shape[0] < 2:
        return int(off[0]), int(off[-1]), -1, 0, 0
    # Order is tested by comparison, not by the sign of a difference: differences of
    # far-apart int64 (or int32) offsets wrap around.
    down = off[1:] < off[:-1]
    at = xp.argmax(down)
    steps = xp.diff(off)  # exact once the offsets are known to be ordered and within [0, n]
    summary = xp.stack(
        [
            off[0].astype(xp.int64),
            off[-1].astype(xp.int64),
            xp.where(down[at], at, -1).astype(xp.int64),
            steps.min().astype(xp.int64),
            steps.max().astype(xp.int64),
        ]
    )
    first, last, at, lo, hi = (int(v) for v in summary.tolist())  # the one synchronization
    return first, last, at, lo, hi


def _lengths_summary(xp: Any, lengths: Any, off: Any) -> tuple[int, int, int, bool, int]:
    if lengths.shape[0] == 0:
        return 0, 0, 0, False, 0
    # Non-negative lengths give non-decreasing offsets unless their running sum wrapped
    # around int64: a decrease of the offsets is that overflow.
    summary = xp.stack(
        [
            lengths.min().astype(xp.int64),
            xp.argmin(lengths).astype(xp.int64),
            lengths.max().astype(xp.int64),
            (off[1:] < off[:-1]).any().astype(xp.int64),
            off[-1],
        ]
    )
    lo, at, hi, wrapped, total = (int(v) for v in summary.tolist())
    return lo, at, hi, bool(wrapped), total


def _lengths_to_offsets(xp: Any, lengths: Any) -> Any:
    off = xp.empty(lengths.shape[0] + 1, dtype=xp.int64)
    off[0] = 0
    xp.cumsum(lengths, dtype=xp.int64, out=off[1:])
    return off


_count_nonzero = getattr(np.count_nonzero, "_implementation", np.count_nonzero)
# (the ufuncs themselves: ndarray.min and max go through Python wrappers, a microsecond a call)
_subtract, _minimum, _maximum = np.subtract, np.minimum.reduce, np.maximum.reduce
#: the largest value of each integer dtype (np.iinfo takes a microsecond a call)
_INT_MAX = {np.dtype(t): int(np.iinfo(t).max) for t in np.typecodes["AllInteger"]}
_INT64, _INT64_MAX = np.dtype(np.int64), int(np.iinfo(np.int64).max)

#: index dtypes used as they are (native byte order)
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


class NumpyAdapter(ArrayAdapter):
    kind = "numpy"
    type_name = "numpy.ndarray"

    def info(self, x: np.ndarray) -> ArrayInfo:
        itemsize = x.dtype.itemsize
        plain = x.dtype.isnative and x.flags.aligned and all(s % itemsize == 0 for s in x.strides)
        return ArrayInfo(x.shape, tuple(s // itemsize for s in x.strides), dtype_name(x.dtype), None, plain)

    def device_of(self, x: np.ndarray) -> None:
        return None

    def reshape(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return x.reshape(shape)

    def is_c_contiguous(self, x: np.ndarray) -> bool:
        return x.flags.c_contiguous

    def is_writeable(self, x: np.ndarray) -> bool:
        return x.flags.writeable

    def empty(self, shape: tuple[int, ...], dtype: str, device: int | None) -> np.ndarray:
        return np.empty(shape, dtype=numpy_dtype(dtype))

    def fill(self, x: np.ndarray, value: Any, stream: Any = None) -> None:
        x.fill(value)

    def copy(self, dst: np.ndarray, src: np.ndarray, stream: Any = None) -> None:
        np.copyto(dst, src)

    #: ``overlaps(a, b)``: NumPy's bounds test, called without its ``__array_function__``
    #: dispatch (a third of its cost, on every call that passes ``out``)
    overlaps = staticmethod(getattr(np.may_share_memory, "_implementation", np.may_share_memory))

    def index_array(self, obj: Any, device: int | None, name: str) -> np.ndarray:
        if type(obj) is np.ndarray and obj.dtype in _INDEX_DTYPES and device is None:
            return obj  # the common case, as it is
        if device is not None:
            raise ValueError(f"{name} for a NumPy array cannot live on CUDA device {device}")
        if not isinstance(obj, np.ndarray) and hasattr(obj, "__cuda_array_interface__"):
            raise TypeError(f"{name} is a device array but x is a host (NumPy) array; pass {name} as a host array")
        module = type(obj).__module__.split(".")[0]
        if module == "torch":  # a CPU tensor: zero-copy; a CUDA tensor: refuse a hidden transfer
            from linred.arrays import refusal  # (not at import: that package imports this module)

            why = refusal(obj, name)
            if why is not None:  # (a sparse or nested tensor)
                raise TypeError(why)
            if obj.device.type != "cpu":
                raise TypeError(f"{name} is a CUDA tensor but x is a host (NumPy) array; pass {name} as a host array")
            obj = obj.numpy()
        return _int_array(np, obj, name)

    def key(self, x: np.ndarray) -> tuple:
        # The dtype carries the byte order; alignment and strides decide plainness.
        return (x.shape, x.strides, x.dtype, x.flags.aligned)

    def key_out(self, x: np.ndarray) -> tuple:
        flags = x.flags  # (a new flags object per access)
        return (x.shape, x.strides, x.dtype, flags.aligned, flags.writeable)

    def out_test(self, shape: tuple[int, ...], dtype: str) -> Any:
        ndarray, want = np.ndarray, numpy_dtype(dtype)  # (native dtypes are singletons: ``is`` holds)

        def fits(out: Any) -> bool:
            return type(out) is ndarray and out.dtype is want and out.shape == shape and out.flags.carray

        return fits

    def out_key(self, shape: tuple[int, ...], dtype: str, device: int | None) -> tuple:
        return self.key_out(np.empty(shape, dtype=numpy_dtype(dtype)))

    def allocator(self, dtype: str, device: int | None) -> Any:
        return functools.partial(np.empty, dtype=numpy_dtype(dtype))

    def resolve_stream(self, stream: Any, device: int | None) -> None:
        if stream is not None:
            raise ValueError(f"stream must be None for host (NumPy) arrays; got {type(stream).__name__}")
        return None

    # On the host there is no synchronization to save: each value is computed only when it is
    # needed (the device version gathers them all for one transfer).

    def offsets_summary(self, offsets: np.ndarray) -> tuple[int, int, int, int, int]:
        first, last = int(offsets[0]), int(offsets[-1])
        count = offsets.shape[0] - 1
        if count < 1:
            return first, last, -1, 0, 0
        # The differences, which may wrap around, are the true ones where none is negative and
        # first + count * the largest stays within the dtype: then no offset can have wrapped
        # (each is at most first + its index times the largest difference).  Else the offsets
        # are compared, which cannot wrap.  (Three passes for valid offsets, not five.)
        steps = _subtract(offsets[1:], offsets[:-1])
        lo, hi = int(_minimum(steps)), int(_maximum(steps))
        if first >= 0 and lo >= 0 and first + count * hi <= _INT_MAX.get(offsets.dtype, -1):
            return first, last, -1, lo, hi
        down = offsets[1:] < offsets[:-1]
        if _count_nonzero(down):
            return first, last, int(np.argmax(down)), 0, 0
        steps = np.diff(offsets)  # (not decreasing: these do not wrap)
        return first, last, -1, int(steps.min()), int(steps.max())

    def lengths_summary(self, lengths: np.ndarray, offsets: np.ndarray) -> tuple[int, int, int, bool, int]:
        if lengths.shape[0] == 0:
            return 0, 0, 0, False, 0
        lo, hi = int(_minimum(lengths)), int(_maximum(lengths))
        at = int(np.argmin(lengths)) if lo < 0 else 0
        # (the int64 cumulative sums of lengths of at most hi, none negative, cannot wrap around
        # where count * hi fits in int64; else the offsets are compared)
        bounded = lo >= 0 and lengths.shape[0] * hi <= _INT64_MAX and offsets.dtype == _INT64
        wrapped = False if bounded else bool(_count_nonzero(offsets[1:] < offsets[:-1]))
        return lo, at, hi, wrapped, int(offsets[-1])

    def lengths_to_offsets(self, lengths: np.ndarray) -> np.ndarray:
        return _lengths_to_offsets(np, lengths)


NUMPY = NumpyAdapter()
adapters[np.ndarray] = NUMPY
