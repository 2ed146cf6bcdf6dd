// bfloat16 rounding: linred's one conversion of a float to bfloat16 bits written out in C++.
//
// Holds linred_bf16_round (float bits -> bfloat16 bits, to nearest even; a NaN stays a
// quiet NaN with its sign), which the cub backend's operators (operators.cuh) and the
// CuPy elementwise kernels (elementwise.cuh) use, on every GPU architecture.  The nvrtc
// kernels, which need compute capability 8.0 for bfloat16, round with the hardware's
// cvt.rn.bf16.f32 instead (common.cuh, Store<bf16_t>), and linred/kernels/elementwise.py
// mirrors this rounding on the host (bf16_bits) for the identities it writes.
// Self-contained: no CUDA headers.

#pragma once

__device__ __forceinline__ unsigned short linred_bf16_round(unsigned int u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN, sign kept
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                   // round to nearest even
}
