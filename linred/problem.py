"""The canonical description of one segmented reduction, shared by every backend.

Whatever the input's rank and ``axis``, linred views the data as a 3-D array
``(batch, n, features)``: ``batch`` is the product of the dimensions before
``axis``, ``n`` the length of ``axis`` and ``features`` the product of the
dimensions after it.  The result is ``(batch, m, features)``, where ``m`` is the
number of segments.  For fixed-length segments the data is further a
``(batch, m, L, features)`` view, and a segmented sum is the matrix product of
that view with a vector of ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """Everything a backend needs to plan a call, and the plan cache's key.

    Attributes
    ----------
    reduction : {"sum", "mean", "max", "min", "prod"}
    kind : {"numpy", "cupy", "torch"}
        The array library of the input and the result.
    device : int or None
        CUDA device ordinal; None for host memory.
    dtype, acc_dtype, out_dtype : str
        Input, accumulation and result dtype names.
    batch, n, features : int
        The input viewed as ``(batch, n, features)``.
    strides : tuple of int
        Strides of that view, in elements.
    num_segments : int
        ``m``.
    segment_length : int or None
        ``L`` for fixed-length segments; None for offsets.
    offsets_dtype : str or None
        ``"int32"`` or ``"int64"`` for offsets; None for fixed length.
    plain : bool
        Whether the data's memory holds its elements as a typed pointer reads them
        (native byte order, aligned, strides whole multiples of the itemsize; see
        :class:`linred.arrays.ArrayInfo`).  Backends that read raw memory refuse
        data that is not.
    """

    reduction: str
    kind: str
    device: int | None
    dtype: str
    acc_dtype: str
    out_dtype: str
    batch: int
    n: int
    features: int
    strides: tuple[int, int, int]
    num_segments: int
    segment_length: int | None
    offsets_dtype: str | None = None
    plain: bool = True

    @property
    def fixed(self) -> bool:
        return self.segment_length is not None

    @property
    def on_gpu(self) -> bool:
        return self.device is not None

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.n, self.features)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.num_segments, self.features)

    def describe(self) -> str:
        """A short human-readable summary, used in logs and error messages."""
        seg = f"L={self.segment_length}" if self.fixed else f"m={self.num_segments} variable"
        where = "host" if self.device is None else f"cuda:{self.device}"
        if not self.plain:
            where += " (byte-swapped, unaligned or with strides not a multiple of the itemsize)"
        return (
            f"segmented_{self.reduction} of {self.kind} {self.dtype} {self.in_shape} on {where}, {seg}, "
            f"accumulating in {self.acc_dtype}, result {self.out_dtype}"
        )
