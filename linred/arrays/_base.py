"""The adapter interface shared by the NumPy, CuPy and PyTorch adapters."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

#: array type -> a cheap function of an array that, with the type, determines its
#: shape, strides, dtype and device; each adapter module registers its type on import
fast_keys: dict[type, Any] = {}


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """What linred needs to know about an array.

    ``strides`` are in elements, not bytes; ``device`` is None for host memory and
    the CUDA device ordinal otherwise.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int | None


class ArrayAdapter:
    """Operations on one array library's arrays.  Subclasses fill every method."""

    #: the library's name: "numpy", "cupy" or "torch"
    kind: str = ""
    #: the array type's name for messages, e.g. "numpy.ndarray"
    type_name: str = ""

    def info(self, x: Any) -> ArrayInfo:
        raise NotImplementedError

    def fast_path(self, dtype: str, device: int | None) -> tuple[Any, Any, Any]:
        """``(prepare(x), empty(shape), stream())`` for repeated calls: the per-call work only."""
        raise NotImplementedError

    def prepare(self, x: Any) -> Any:
        """``x`` ready to be read by raw pointer (torch: lazy conjugation resolved)."""
        return x

    def device_of(self, x: Any) -> int | None:
        raise NotImplementedError

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        """``x`` with a new shape: a view when the layout allows, else a copy."""
        raise NotImplementedError

    def is_c_contiguous(self, x: Any) -> bool:
        raise NotImplementedError

    def is_writeable(self, x: Any) -> bool:
        return True

    def empty(self, shape: tuple[int, ...], dtype: str, device: int | None) -> Any:
        raise NotImplementedError

    def fill(self, x: Any, value: Any, stream: Any = None) -> None:
        """Set every element of ``x`` to ``value``, on ``stream`` for device arrays."""
        raise NotImplementedError

    def index_array(self, obj: Any, device: int | None, name: str) -> Any:
        """``obj`` (any array-like) as a 1-D-or-more integer array of this kind on ``device``.

        int32 and int64 arrays are used as they are (no copy when already on the
        device); other integer dtypes become int64.  Non-integer input raises
        TypeError naming ``name``.
        """
        raise NotImplementedError

    def to_numpy(self, x: Any) -> Any:
        """A host NumPy copy (or view) of ``x``; synchronizes for device arrays."""
        raise NotImplementedError

    def on_stream(self, stream: Any, device: int | None) -> Any:
        """A context in which the library's own operations run on ``stream`` (a resolved handle)."""
        return contextlib.nullcontext()

    def resolve_stream(self, stream: Any, device: int | None) -> Any:
        """The stream work on ``device`` runs on: ``stream`` or the library's current one."""
        raise NotImplementedError

    # Index work for offsets and lengths.  Each returns host Python ints after one
    # synchronization, which is all ``check=True`` costs on a device.

    def offsets_summary(self, offsets: Any) -> tuple[int, int, int, int, int]:
        """``(offsets[0], offsets[-1], min step, index of the min step, max step)``.

        The steps are ``offsets[1:] - offsets[:-1]`` (the segment lengths); for a
        single offset the three step values are 0.
        """
        raise NotImplementedError

    def lengths_summary(self, lengths: Any) -> tuple[int, int, int, int]:
        """``(min length, index of the min, sum, max length)``; zeros for an empty array."""
        raise NotImplementedError

    def lengths_to_offsets(self, lengths: Any) -> Any:
        """int64 offsets ``[0, cumsum(lengths)...]`` on the lengths' device."""
        raise NotImplementedError

    def value_at(self, a: Any, i: int) -> int:
        """``int(a[i])`` (synchronizes for device arrays); used to build error messages."""
        return int(a[i])
