"""linred's own CUDA C++, and its one path to code.

The headers, by concern (each opens with the list of what it holds):

- ``common.cuh``: types, conversions, operations and the building blocks every kernel
  family shares;
- ``offsets.cuh``: segment boundaries and the tiling of rows;
- ``fixed.cuh`` (``fixed_small``, ``fixed_rows``, ``fixed_long``), ``tile.cuh``
  (``tile_reduce``, ``tile_bounds``), ``warp.cuh`` (``warp_reduce``), ``fixup.cuh``
  (``tile_fixup``), ``features.cuh`` (``features_reduce``): the nvrtc backend's kernel
  families, each with the macros that make its ``extern "C"`` entry points;
- ``softmax.cuh`` (``softmax_family``), ``softmax_grad.cuh`` (``softmax_grad``, its
  derivatives) and ``arg.cuh`` (``first_hit``): the kernels of :mod:`linred._softmax_kernel`
  and :mod:`linred._arg_kernel`; ``pieces.cuh`` (``pieces_bounds``, ``pieces_join``): var and
  std of long segments from the moments of their pieces (:mod:`linred._pieces`);
- ``operators.cuh``: the device operators the cub backend hands cuda.compute;
- ``bf16.cuh``: the bfloat16 rounding written out in C++ (operators and CuPy kernels);
- ``elementwise.cuh``: the preamble of the CuPy elementwise kernels.

:mod:`linred.kernels.compiler` assembles programs from these headers and compiles them
with NVRTC (cubins for the nvrtc backend, LTO-IR for the cub backend's operators),
caching the binaries in memory and on disk; :mod:`linred.kernels.elementwise` holds the
CuPy elementwise kernels (CuPy compiles them).
"""
