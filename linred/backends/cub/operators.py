"""The device operators the ``cccl`` path hands cuda.compute, and the state they read.

cuda.compute links each operator (``extern "C" __device__``, compiled to LTO-IR by
:func:`linred.kernels.compiler.get_ltoir`) into CUB's kernels: segment boundaries
computed from the segment index (fixed lengths, batches whose rows are not adjacent,
offsets shared by every batch), 16-bit floats widened on the way in, results scaled
and rounded on the way out, and max/min that propagate NaN.  Their C++ is
``linred/kernels/operators.cuh``.  Pure: the programs and the state layouts are tested
without a GPU; :mod:`.executors` compiles them.
"""

from __future__ import annotations

import numpy as np

#: the operators of ``linred/kernels/operators.cuh``
OPERATORS = (
    "linred_mul",
    "linred_batched_fixed",
    "linred_batched_offsets32",
    "linred_batched_offsets64",
    "linred_f16_to_f32",
    "linred_bf16_to_f32",
    "linred_scale_f32_to_f16",
    "linred_scale_f32_to_bf16",
    "linred_scale_f32",
    "linred_scale_f64",
    "linred_max_f32",
    "linred_min_f32",
    "linred_max_f64",
    "linred_min_f64",
)


def op_source(name: str) -> str:
    """The program of operator ``name`` alone: ``operators.cuh`` with ``LINRED_OP_<name>`` defined.

    Each operator is compiled on its own, so that a build linking one operator twice
    (start and end offsets) links identical LTO-IR, which cuda.compute deduplicates.
    """
    if name not in OPERATORS:
        raise KeyError(f"no operator {name!r} in operators.cuh")
    return f'#define LINRED_OP_{name}\n#include "operators.cuh"\n'


def batch_state(a: int, count: int, batch_stride: int, shift: int) -> bytes:
    """The state of ``linred_batched_*``: ``linred_batch_state`` (L or the offsets' address,
    segments per batch row, the batch stride, a shift of the segment index)."""
    return np.array([a, count, batch_stride, shift], dtype=np.int64).tobytes()


def mul_state(length: int) -> bytes:
    """The state of ``linred_mul``: the segment length."""
    return np.array([length], dtype=np.int64).tobytes()
