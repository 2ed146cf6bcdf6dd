// features_reduce: segments of rows of several contiguous feature columns.
//
// Holds:
//  - features_reduce: one thread per (row of the batch, segment, group of W consecutive
//    features), walking the segment's rows with UNROLL loads in flight;
//  - Group (W features), FeatureArgs, SumWide (float32 sums accumulated in double);
//  - its entry point: LINRED_FEATURES (linred_features).

#pragma once

#include "offsets.cuh"

// out[r, s, f] = reduce over rows i in [off(s), off(s + 1)) of x[r, i, f], for data
// whose feature columns are contiguous.  One thread per (row of the batch, segment,
// group of W consecutive features), walking the segment's rows with UNROLL loads in
// flight; neighbouring lanes read neighbouring feature groups of the same row, so
// every load is coalesced.  W = 16 bytes of features where rows are 16-byte aligned,
// else 1; results go out as 16-byte vectors where W results fill whole ones (the
// caller only passes such a W when the result rows are 16-byte aligned).
template <class T, int W> struct Group { struct __align__(W * sizeof(T) >= 16 ? 16 : sizeof(T)) type { T v[W]; }; };

struct FeatureArgs {
    i64 n;            // rows per batch row
    i64 m;            // segments per batch row
    i64 batch_stride; // elements between batch rows of x
    i64 row_stride;   // elements between rows of x
    i64 features;     // D
    i64 groups;       // feature groups per row: D / W
    i64 total;        // batch * m * groups threads
};

// A thread of features_reduce adds a segment's rows one after another: in float32 a long
// segment would lose digits (each addition rounds to the running sum's precision; 2^22 rows
// of positive data came out 4e-3 off), so float32 sums are accumulated in double there.
// The kernel is memory-bound: the wider additions cost no time.
template <class OP, class A> struct SumWide { typedef A type; };
template <> struct SumWide<OpSum, float> { typedef double type; };

template <class T, class A0, class O, class OP, bool MEAN, int W, int UNROLL, class Off>
__device__ __forceinline__ void features_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, FeatureArgs a) {
    typedef typename Group<T, W>::type G;
    typedef typename SumWide<OP, A0>::type A;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < a.total; t += stride) {
        const i64 g = t % a.groups, rs = t / a.groups;  // rs: batch row * m + segment
        const i64 r = rs / a.m, s = rs - r * a.m;
        const i64 begin = off(s), end = off(s + 1);
        const T* p = x + r * a.batch_stride + g * W;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
        i64 i = begin;
        for (; i + UNROLL <= end; i += UNROLL) {
            G buf[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) buf[u] = *reinterpret_cast<const G*>(p + (i + u) * a.row_stride);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(buf[u].v[k]));
            }
        }
        for (; i < end; ++i) {
            const G v = *reinterpret_cast<const G*>(p + i * a.row_stride);
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(v.v[k]));
        }
        O* o = out + rs * a.features + g * W;
        if constexpr ((W * sizeof(O)) % 16 == 0) {  // whole 16-byte vectors of results
            typedef typename VecOf<O>::type VO;
            constexpr int NO = VecOf<O>::N;
#pragma unroll
            for (int c = 0; c < W / NO; ++c) {
                VO r;
#pragma unroll
                for (int k = 0; k < NO; ++k) r.v[k] = finish<O, MEAN>(acc[c * NO + k], end - begin);
                *reinterpret_cast<VO*>(o + c * NO) = r;
            }
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], end - begin);
        }
    }
}

// ---- entry points -----------------------------------------------------------------
// linred_features: features_reduce; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
#define LINRED_FEATURES(T, A, O, OP, MEAN, THREADS, W, UNROLL, I, OFFSETS)                                     \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_features(const T* x, O* out, const I* offsets, long long L, long long n, long long m,            \
                        long long bs, long long rs, long long d, long long groups, long long total) {          \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                         \
        features_reduce<T, A, O, OP, MEAN, W, UNROLL>(x, out, OFFSETS, a);                                     \
    }
