// The preamble of the CuPy elementwise kernels of linred/kernels/elementwise.py (CuPy
// compiles them with NVRTC and its own headers, writing each kernel around the operation
// that elementwise.py generates per dtype).
//
// Holds:
//  - linred_bf16_value and linred_bf16_bits: bfloat16 data and results, passed as int16
//    bits (CuPy has no bfloat16 dtype), to float and back (rounded by bf16.cuh);
//  - LINRED_NAN_F, LINRED_NAN_D, LINRED_INF_F, LINRED_INF_D: NaN and infinities from bit
//    patterns (NVRTC has no <cmath> here).

#pragma once

#include "bf16.cuh"

__device__ __forceinline__ float linred_bf16_value(short h) {
    return __uint_as_float(((unsigned int)(unsigned short)h) << 16);
}
__device__ __forceinline__ short linred_bf16_bits(float v) {
    return (short)linred_bf16_round(__float_as_uint(v));
}
#define LINRED_NAN_F __int_as_float(0x7fc00000)
#define LINRED_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#define LINRED_INF_F __int_as_float(0x7f800000)
#define LINRED_INF_D __longlong_as_double(0x7ff0000000000000LL)
