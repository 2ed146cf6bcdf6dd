// feature_long: the sums of the long segments of feature rows cut into tiles of ROWS rows,
// so that no thread walks more than ROWS rows of one feature group whatever the lengths.
//
// Holds:
//  - feature_long_fixup: one thread per (row of the batch, segment, feature group); for a long
//    segment, adds its head (the rows before its first tile start j0, added by
//    features_reduce) and the partials of its tiles (long_tile), in order (deterministic),
//    and writes the result;
//  - its entry points: LINRED_FEATURES_LONG (linred_features: features_reduce with ROWS, its
//    tiles of long segments included; linred_feature_long_fixup).
//
// features_reduce gives a segment one thread per feature group, so the longest segment's
// chain of round trips sets a call's time where lengths vary (a segment of 5% of 10^6 x 128
// rows: 8.2 ms on an H200); with ROWS, its launch also reads the tiles of the segments of more
// than long_rows rows, and this second launch adds their partials.  It checks the offsets it
// reads, so bad offsets give wrong results but no access outside the results or the partials.

#pragma once

#include "features.cuh"

// out[r, s, g] for each long segment s: its head, then the partials of its tiles j0 (its first
// tile start) to the last, in that order, eight partials' loads in flight.
template <class T, class A0, class O, class OP, bool MEAN, int W, int ROWS, class Off>
__device__ __forceinline__ void feature_long_fixup(O* __restrict__ out, Off off, FeatureArgs a, i64 long_rows,
                                                   i64 tiles, const typename SumWide<OP, A0>::type* __restrict__ first,
                                                   const typename SumWide<OP, A0>::type* __restrict__ partial) {
    typedef typename SumWide<OP, A0>::type A;
    constexpr int FLIGHT = 8;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < a.total; t += stride) {
        const i64 g = t % a.groups, rs = t / a.groups;  // rs: batch row * m + segment
        const i64 r = rs / a.m, s = rs - r * a.m;
        const i64 b0 = off(s), b1 = off(s + 1);
        if (!(0 <= b0 && b1 <= a.n && b1 - b0 > long_rows)) continue;
        const i64 j0 = b0 / ROWS + (b0 % ROWS != 0), last = min((b1 - 1) / ROWS, tiles - 1);
        const A* h = partial + (r * tiles) * a.features + g * W;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = first[(r * tiles + j0) * a.features + g * W + k];
        i64 q = j0;
        for (; q + FLIGHT <= last + 1; q += FLIGHT) {
            A b[FLIGHT][W];
#pragma unroll
            for (int u = 0; u < FLIGHT; ++u) {
#pragma unroll
                for (int k = 0; k < W; ++k) b[u][k] = h[(q + u) * a.features + k];
            }
#pragma unroll
            for (int u = 0; u < FLIGHT; ++u) {
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], b[u][k]);
            }
        }
        for (; q <= last; ++q) {
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], h[q * a.features + k]);
        }
        O* o = out + rs * a.features + g * W;
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], b1 - b0);
    }
}

// ---- entry points -----------------------------------------------------------------
// OFFSETS is ArrayOffsets<I>{offsets}.  linred_features takes features_reduce's arguments,
// then long_rows, the tiles per batch row, tile_items (batch * tiles * groups), the heads
// and the partials; linred_feature_long_fixup total = batch * m * groups threads.
#define LINRED_FEATURES_LONG(T, A, O, OP, MEAN, THREADS, W, UNROLL, ROWS, I, OFFSETS)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,         \
                        long long bs, long long rs, long long d, long long groups, long long total,                   \
                        long long long_rows, long long tiles, long long tile_items, SumWide<OP, A>::type* first,      \
                        SumWide<OP, A>::type* partial) {                                                               \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_reduce<T, A, O, OP, MEAN, W, UNROLL, ROWS>(                                                           \
            x, out, OFFSETS, a, bad, LongArgs<SumWide<OP, A>::type>{long_rows, tiles, tile_items, first, partial});   \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_feature_long_fixup(O* out, const I* offsets, long long n, long long m, long long d, long long groups,   \
                                  long long total, long long long_rows, long long tiles,                               \
                                  const SumWide<OP, A>::type* first, const SumWide<OP, A>::type* partial) {            \
        FeatureArgs a{n, m, 0, 0, d, groups, total};                                                                   \
        feature_long_fixup<T, A, O, OP, MEAN, W, ROWS>(out, OFFSETS, a, long_rows, tiles, first, partial);             \
    }
