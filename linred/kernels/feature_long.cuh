// feature_long: the long segments of feature rows cut into tiles of ROWS rows, so that no
// thread walks more than ROWS rows of one feature group whatever the lengths.
//
// Holds:
//  - long_segment: the long segment (at most one) that a tile's first row lies in, read from
//    the bounds features_reduce wrote and checked against the offsets;
//  - feature_long_tiles: one thread per (row of the batch, tile, feature group) adds the
//    tile's rows of that segment into a partial;
//  - feature_long_fixup: one thread per (row of the batch, long segment, feature group), the
//    one of the segment's first tile, adds its head (the rows before that tile, added by
//    features_reduce) and its tiles' partials in order (deterministic), and writes the result;
//  - its entry points: LINRED_FEATURES_LONG (linred_features: features_reduce with ROWS,
//    linred_feature_long_tiles, linred_feature_long_fixup).
//
// features_reduce gives a segment one thread per feature group, so the longest segment's
// chain of round trips sets a call's time where lengths vary (a segment of 5% of 10^6 x 128
// rows: 8.2 ms on an H200); it leaves the segments of more than long_rows rows to these two
// kernels.  Each checks what it reads against the offsets, so bad offsets give wrong results
// but no access outside the data, the results or the partials.

#pragma once

#include "features.cuh"

// The long segment s whose rows include row j * ROWS, or -1: bounds[j] where the offsets
// agree that it is long and holds that row.  b0, b1: its bounds.
template <int ROWS, class Off>
__device__ __forceinline__ i64 long_segment(const i64* __restrict__ bounds, Off off, i64 j, i64 n, i64 m,
                                            i64 long_rows, i64& b0, i64& b1) {
    const i64 s = bounds[j];
    if (s < 0 || s >= m) return -1;
    b0 = off(s);
    b1 = off(s + 1);
    const i64 r0 = j * ROWS;
    return 0 <= b0 && b0 <= r0 && r0 < b1 && b1 <= n && b1 - b0 > long_rows ? s : -1;
}

// partial[r, j, g] = the rows of tile j (of row r of the batch) in the long segment its
// first row lies in.
template <class T, class A0, class O, class OP, int W, int UNROLL, int ROWS, class Off>
__device__ __forceinline__ void feature_long_tiles(const T* __restrict__ x, Off off, FeatureArgs a, i64 long_rows,
                                                   i64 tiles, const i64* __restrict__ bounds,
                                                   typename SumWide<OP, A0>::type* __restrict__ partial) {
    typedef typename SumWide<OP, A0>::type A;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < a.total; t += stride) {
        const i64 g = t % a.groups, rj = t / a.groups;  // rj: batch row * tiles + tile
        const i64 r = rj / tiles, j = rj - r * tiles;
        i64 b0, b1;
        if (long_segment<ROWS>(bounds, off, j, a.n, a.m, long_rows, b0, b1) < 0) continue;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
        const i64 r0 = j * ROWS;
        add_rows<T, A, OP, W, UNROLL>(acc, x + r * a.batch_stride + g * W, r0, min(b1, r0 + ROWS), a.row_stride);
        A* h = partial + rj * a.features + g * W;
#pragma unroll
        for (int k = 0; k < W; ++k) h[k] = acc[k];
    }
}

// out[r, s, g] for each long segment s: its head, then the partials of its tiles j0 (its first
// tile start) to the last, in that order, eight partials' loads in flight.  (Done by the
// last tile to finish, in the launch before, this took longer: the registers of those loads
// in flight cut that launch's occupancy.)
template <class T, class A0, class O, class OP, bool MEAN, int W, int ROWS, class Off>
__device__ __forceinline__ void feature_long_fixup(O* __restrict__ out, Off off, FeatureArgs a, i64 long_rows,
                                                   i64 tiles, const i64* __restrict__ bounds,
                                                   const typename SumWide<OP, A0>::type* __restrict__ first,
                                                   const typename SumWide<OP, A0>::type* __restrict__ partial) {
    typedef typename SumWide<OP, A0>::type A;
    constexpr int FLIGHT = 8;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < a.total; t += stride) {
        const i64 g = t % a.groups, rj = t / a.groups;
        const i64 r = rj / tiles, j = rj - r * tiles;
        i64 b0, b1;
        const i64 s = long_segment<ROWS>(bounds, off, j, a.n, a.m, long_rows, b0, b1);
        if (s < 0 || j != b0 / ROWS + (b0 % ROWS != 0)) continue;  // not the segment's first tile
        const i64 last = min((b1 - 1) / ROWS, tiles - 1);
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = first[rj * a.features + g * W + k];
        const A* h = partial + (r * tiles) * a.features + g * W;
        i64 q = j;
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
        O* o = out + (r * a.m + s) * a.features + g * W;
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], b1 - b0);
    }
}

// ---- entry points -----------------------------------------------------------------
// OFFSETS is ArrayOffsets<I>{offsets}.  linred_features takes features_reduce's arguments,
// then long_rows, the tiles per batch row, bounds and the heads; the other two take total =
// batch * tiles * groups threads.
#define LINRED_FEATURES_LONG(T, A, O, OP, MEAN, THREADS, W, UNROLL, ROWS, I, OFFSETS)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,         \
                        long long bs, long long rs, long long d, long long groups, long long total,                   \
                        long long long_rows, long long tiles, long long* bounds, SumWide<OP, A>::type* first) {       \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_reduce<T, A, O, OP, MEAN, W, UNROLL, ROWS>(                                                           \
            x, out, OFFSETS, a, bad, LongArgs<SumWide<OP, A>::type>{long_rows, tiles, bounds, first});                \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_feature_long_tiles(const T* x, const I* offsets, long long n, long long m, long long bs, long long rs,  \
                                  long long d, long long groups, long long total, long long long_rows,                 \
                                  long long tiles, const long long* bounds, SumWide<OP, A>::type* partial) {           \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        feature_long_tiles<T, A, O, OP, W, UNROLL, ROWS>(x, OFFSETS, a, long_rows, tiles, bounds, partial);            \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_feature_long_fixup(O* out, const I* offsets, long long n, long long m, long long d, long long groups,   \
                                  long long total, long long long_rows, long long tiles, const long long* bounds,      \
                                  const SumWide<OP, A>::type* first, const SumWide<OP, A>::type* partial) {            \
        FeatureArgs a{n, m, 0, 0, d, groups, total};                                                                   \
        feature_long_fixup<T, A, O, OP, MEAN, W, ROWS>(out, OFFSETS, a, long_rows, tiles, bounds, first, partial);     \
    }
