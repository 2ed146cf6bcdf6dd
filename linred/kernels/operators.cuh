// The device operators of the cub backend's cccl path (linred/backends/cub/): cuda.compute
// links them, compiled to LTO-IR, into CUB's DeviceSegmentedReduce kernels.
//
// Each operator is compiled on its own (linred/kernels/compiler.py, get_ltoir), with
// LINRED_OP_<its name> defined, so that a build linking one operator twice (start and end
// offsets) links identical LTO-IR, which cuda.compute deduplicates.  Holds:
//  - segment boundaries from the flat segment index k (state: linred_batch_state, or L):
//    linred_mul (k * L), linred_batched_fixed ((k / m) * batch_stride + (k % m + shift) * L),
//    linred_batched_offsets32 and linred_batched_offsets64
//    ((k / m) * batch_stride + offsets[k % m + shift]);
//  - 16-bit floats read as 16-bit words, widened exactly: linred_f16_to_f32,
//    linred_bf16_to_f32;
//  - results times a scale (1 or 1/L), rounded to the result type (state: the scale):
//    linred_scale_f32_to_f16, linred_scale_f32_to_bf16 (bf16.cuh), linred_scale_f32,
//    linred_scale_f64;
//  - max and min that propagate NaN, like NumPy (written by LINRED_NAN_MAX_MIN):
//    linred_max_f32, linred_min_f32, linred_max_f64, linred_min_f64.
// Self-contained: no CUDA headers (conversions use PTX).

#pragma once

struct linred_batch_state { long long a; long long count; long long batch_stride; long long shift; };

#if defined(LINRED_OP_linred_bf16_to_f32) || defined(LINRED_OP_linred_scale_f32_to_bf16)
[[maybe_unused]] static __device__ __forceinline__ float linred_as_float(unsigned int u) {
    float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u)); return f;
}
[[maybe_unused]] static __device__ __forceinline__ unsigned int linred_as_uint(float f) {
    unsigned int u; asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f)); return u;
}
#endif

// ---- segment boundaries ------------------------------------------------------------
#ifdef LINRED_OP_linred_mul
// start offset of flat segment k: k * L (state: L)
extern "C" __device__ void linred_mul(void* state, void* in, void* out) {
    *(long long*)out = *(const long long*)in * *(const long long*)state;
}
#endif

#ifdef LINRED_OP_linred_batched_fixed
// (k / m) * batch_stride + (k % m + shift) * L  (state: L, m, batch_stride, shift)
extern "C" __device__ void linred_batched_fixed(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    *(long long*)out = b * s->batch_stride + (k - b * s->count + s->shift) * s->a;
}
#endif

#ifdef LINRED_OP_linred_batched_offsets32
// (k / m) * batch_stride + offsets[k % m + shift]  (state: offsets pointer, m, batch_stride, shift)
extern "C" __device__ void linred_batched_offsets32(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    const int* offsets = (const int*)s->a;
    *(long long*)out = b * s->batch_stride + (long long)offsets[k - b * s->count + s->shift];
}
#endif

#ifdef LINRED_OP_linred_batched_offsets64
extern "C" __device__ void linred_batched_offsets64(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    const long long* offsets = (const long long*)s->a;
    *(long long*)out = b * s->batch_stride + offsets[k - b * s->count + s->shift];
}
#endif

// ---- 16-bit floats in --------------------------------------------------------------
#ifdef LINRED_OP_linred_f16_to_f32
extern "C" __device__ void linred_f16_to_f32(void* in, void* out) {
    const unsigned short h = *(const unsigned short*)in;
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    *(float*)out = f;
}
#endif

#ifdef LINRED_OP_linred_bf16_to_f32
extern "C" __device__ void linred_bf16_to_f32(void* in, void* out) {
    *(float*)out = linred_as_float(((unsigned int)*(const unsigned short*)in) << 16);
}
#endif

// ---- results out: times a scale, rounded to the result type ------------------------
#ifdef LINRED_OP_linred_scale_f32_to_f16
extern "C" __device__ void linred_scale_f32_to_f16(void* state, void* in, void* out) {
    const float v = *(const float*)in * *(const float*)state;
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *(unsigned short*)out = h;
}
#endif

#ifdef LINRED_OP_linred_scale_f32_to_bf16
#include "bf16.cuh"
extern "C" __device__ void linred_scale_f32_to_bf16(void* state, void* in, void* out) {
    *(unsigned short*)out = linred_bf16_round(linred_as_uint(*(const float*)in * *(const float*)state));
}
#endif

#ifdef LINRED_OP_linred_scale_f32
extern "C" __device__ void linred_scale_f32(void* state, void* in, void* out) {
    *(float*)out = *(const float*)in * *(const float*)state;
}
#endif

#ifdef LINRED_OP_linred_scale_f64
extern "C" __device__ void linred_scale_f64(void* state, void* in, void* out) {
    *(double*)out = *(const double*)in * *(const double*)state;
}
#endif

// ---- max and min that propagate NaN ------------------------------------------------
#define LINRED_NAN_MAX_MIN(NAME, T, CMP)                                 \
    extern "C" __device__ void NAME(void* a, void* b, void* out) {     \
        const T x = *(const T*)a, y = *(const T*)b;                      \
        *(T*)out = (x != x || x CMP y) ? x : y;                          \
    }
#ifdef LINRED_OP_linred_max_f32
LINRED_NAN_MAX_MIN(linred_max_f32, float, >)
#endif
#ifdef LINRED_OP_linred_min_f32
LINRED_NAN_MAX_MIN(linred_min_f32, float, <)
#endif
#ifdef LINRED_OP_linred_max_f64
LINRED_NAN_MAX_MIN(linred_max_f64, double, >)
#endif
#ifdef LINRED_OP_linred_min_f64
LINRED_NAN_MAX_MIN(linred_min_f64, double, <)
#endif
