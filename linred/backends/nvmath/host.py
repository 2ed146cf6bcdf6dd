"""The nvmath backend on the host: ``nvmath.linalg.Matmul`` executed by MKL (``ExecutionCPU``).

Imported only when a host problem is planned, after nvmath has been found to
work.  NumPy arrays and CPU PyTorch tensors (viewed as NumPy, no copy) are
multiplied in place: the products write the result straight into ``out3``
(``MatmulOptions(inplace=True)`` with ``c`` the result and ``beta = 0``).  Complex
data is multiplied as its real and imaginary parts (``.real`` views, see
:func:`linred.backends.nvmath.layout.as_real`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nvmath.linalg import Matmul, MatmulOptions
from nvmath.linalg.generic import ExecutionCPU

from linred._dtypes import numpy_dtype
from linred.arrays.views import host_view, physical
from linred.backends.nvmath.layout import Layout, View
from linred.problem import Problem
from linred.segments import Segments


def view(base: np.ndarray, v: View) -> np.ndarray:
    itemsize = base.itemsize
    return np.lib.stride_tricks.as_strided(base, v.shape, tuple(s * itemsize for s in v.strides))


class HostExecutor:
    """Runs a :class:`Layout` through planned MKL products, rebinding the operands on every call.

    The ``Matmul`` objects are built on the first call (they need operands of the
    right layout) and keep no reference to the caller's arrays between calls.
    """

    def __init__(self, problem: Problem, layout: Layout, logger: Any, *, complex_as_real: bool = False) -> None:
        dtype = numpy_dtype(problem.dtype)
        self._layout = layout
        self._real = complex_as_real
        self._alpha = 1.0 / problem.segment_length if problem.reduction == "mean" else 1.0
        buffers = {name: np.ones(kind[1], dtype=dtype) for name, kind in layout.constants.items()}
        buffers.update({name: np.empty(size, dtype=dtype) for name, size in layout.temporaries.items()})
        # views of the executor's own buffers are made once; only the data and result change per call
        self._fixed = [
            {key: view(buffers[v.src], v) for key, v in zip("abc", (p.a, p.b, p.c), strict=True) if v.src in buffers}
            for p in layout.products
        ]
        self._buffers = buffers
        self._options = MatmulOptions(inplace=True, logger=logger)
        self._execution = ExecutionCPU()
        self._matmuls: list[Any] = [None] * len(layout.products)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        x, conjugate = physical(x)
        x3, out3 = host_view(x), host_view(out)
        if self._real:  # complex data as its real and imaginary parts (views)
            x3, out3 = x3.real, out3.real
        sources = {**self._buffers, "x": x3, "out": out3}
        for i, product in enumerate(self._layout.products):
            fixed = self._fixed[i]
            a = fixed.get("a")
            a = view(sources[product.a.src], product.a) if a is None else a
            b = fixed.get("b")
            b = view(sources[product.b.src], product.b) if b is None else b
            c = fixed.get("c")
            c = view(sources[product.c.src], product.c) if c is None else c
            mm = self._matmuls[i]
            if mm is None:
                alpha = self._alpha if product.scaled else 1.0
                mm = Matmul(a, b, c=c, alpha=alpha, beta=0.0, options=self._options, execution=self._execution)
                mm.plan()
                self._matmuls[i] = mm
            else:
                mm.reset_operands_unchecked(a=a, b=b, c=c)
            mm.execute()
            mm.release_operands()  # keep no reference to the caller's arrays
        if self._layout.copy_from is not None:
            np.copyto(out3, view(sources[self._layout.copy_from.src], self._layout.copy_from))
        if conjugate:  # the data was a lazily conjugated tensor, summed as stored
            imag = host_view(out).imag
            np.negative(imag, out=imag)

    def free(self) -> None:
        for mm in self._matmuls:
            if mm is not None:
                mm.free()
        self._matmuls = []
        self._buffers = {}
