// first_hit: where each segment's extreme first appears (segmented_argmax and argmin, and the
// gradient of max and min for PyTorch).
//
// Holds:
//  - first_hit: threads over (row of the batch, tile of ARG_ROWS rows, feature), neighbouring
//    threads on neighbouring features of a row.  A thread loads its tile's first rows, finds the
//    segment of its first row (segment_of), walks the rows of its feature ARG_LOADS loads at a time and, in each
//    segment it meets, takes the first row whose value is the segment's extreme (same_value):
//    first[row of the batch, segment, feature] is lowered to it by atomicMin.  The smallest row
//    over every tile is what is left, whatever order the tiles run in: the same result every run;
//  - load_rows: a step of ARG_LOADS rows' loads;
//  - same_value: a value that is the extreme (compared as promote makes them; a NaN extreme is
//    met by the first NaN, as numpy.argmax finds it);
//  - segment_of: the last segment starting at or before a row (a binary search of the offsets,
//    or row / L for a fixed length);
//  - ARG_ROWS and ARG_LOADS (LINRED_ARG_ROWS, LINRED_ARG_LOADS where the program defines them), and
//    the entry point: LINRED_FIRST_HIT (linred_first_hit).
//
// first holds n (past the end) where the caller filled it: an empty segment keeps n.  Rows
// outside every segment (offsets that do not cover [0, n), or a fixed length's remainder) are
// never taken, and no load or store leaves its array whatever the offsets hold.

#pragma once

#include "offsets.cuh"

// Rows of one feature a thread walks, and the loads it keeps in flight: 16 steps of 8 loads, so
// that a warp waits for memory 16 times per tile, not 128 times, and its search of the offsets
// (a chain of dependent loads) is paid once per 128 rows, while its first loads are in flight.
// (An H200 sweep of 64 to 256 rows and 8 or 16 loads: 128 x 8 within 1% of the best everywhere,
// 4-16% faster than 64 x 8 at 10^6 x 128, 10^7 x 16 and 10^7 x 1.)
// linred._arg_kernel defines both (LINRED_ARG_ROWS, LINRED_ARG_LOADS) before it includes this
// header; these are its defaults.
#ifndef LINRED_ARG_ROWS
#define LINRED_ARG_ROWS 128
#endif
#ifndef LINRED_ARG_LOADS
#define LINRED_ARG_LOADS 8
#endif
constexpr int ARG_ROWS = LINRED_ARG_ROWS;
constexpr int ARG_LOADS = LINRED_ARG_LOADS;

template <class T> __device__ __forceinline__ bool same_value(T v, T e) {
    const auto a = promote(v), b = promote(e);
    return a == b || (a != a && b != b);  // (integers: never NaN)
}

// The last segment s in [0, m) with off(s) <= row (0 if none), m >= 1.
template <class I> __device__ __forceinline__ i64 segment_of(const ArrayOffsets<I>& off, i64 m, i64 row) {
    i64 lo = 0, hi = m - 1;
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if (off(mid) <= row) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}
__device__ __forceinline__ i64 segment_of(const FixedOffsets& off, i64 m, i64 row) { return min(row / off.L, m - 1); }

// v[u] = xc[(q + u) * d] for the rows q + u before row1 (the others are left as they are).
template <class T>
__device__ __forceinline__ void load_rows(T (&v)[ARG_LOADS], const T* __restrict__ xc, i64 d, i64 q, i64 row1) {
#pragma unroll
    for (int u = 0; u < ARG_LOADS; ++u) {
        if (q + u < row1) v[u] = xc[(q + u) * d];
    }
}

// x: (batch, n, d) and extreme, first: (batch, m, d), C-contiguous; items = batch * tiles * d.
template <class T, class Off>
__device__ __forceinline__ void first_hit(const T* __restrict__ x, const T* __restrict__ extreme,
                                          long long* __restrict__ first, const Off& off, i64 n, i64 m, i64 d,
                                          i64 items) {
    const i64 tiles = (n + ARG_ROWS - 1) / ARG_ROWS;
    for (i64 w = blockIdx.x * (i64)blockDim.x + threadIdx.x; w < items; w += (i64)gridDim.x * blockDim.x) {
        const i64 c = w % d, t = (w / d) % tiles, r = w / d / tiles;
        const i64 row0 = t * ARG_ROWS, row1 = min(n, row0 + ARG_ROWS);
        const T* xc = x + r * n * d + c;
        T v[ARG_LOADS];
        load_rows(v, xc, d, row0, row1);  // (in flight during the search, which does not need them)
        i64 s = segment_of(off, m, row0);
        i64 begin = off(s), end = off(s + 1);
        const T* e_row = extreme + r * m * d + c;
        T e = e_row[s * d];
        bool done = false;  // this segment's first row in the tile is taken
        for (i64 q = row0;;) {
#pragma unroll
            for (int u = 0; u < ARG_LOADS; ++u) {
                const i64 row = q + u;
                if (row >= row1) break;
                while (row >= end && s + 1 < m) {  // (empty segments passed over)
                    ++s;
                    begin = end;
                    end = off(s + 1);
                    e = e_row[s * d];
                    done = false;
                }
                if (!done && begin <= row && row < end && same_value(v[u], e)) {
                    atomicMin(first + (r * m + s) * d + c, (long long)row);
                    done = true;
                }
            }
            q += ARG_LOADS;
            if (q >= row1) break;
            load_rows(v, xc, d, q, row1);
        }
    }
}

#define LINRED_FIRST_HIT(T, I, OFFSETS)                                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        linred_first_hit(const T* x, const T* extreme, long long* first, const I* offsets, long long L,         \
                         long long n, long long m, long long d, long long items) {                              \
        first_hit<T>(x, extreme, first, OFFSETS, n, m, d, items);                                              \
    }
