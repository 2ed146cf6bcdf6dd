// pieces: var and std of long segments from the moments of pieces of them (linred/_pieces.py).
//
// Holds:
//  - pieces_bounds: the segments' bounds and the multiples of `rows` inside (0, n) as one sorted
//    list (a bound equal to a multiple first: an empty piece between them), and where each
//    segment's bound lies in it (the segments' offsets over the pieces);
//  - pieces_join: each (row of the batch, segment, feature) from its pieces' moments (the
//    softmax family's SOFTMAX_MOMENTS: a piece's mean and sum of squared deviations, in double),
//    joined by the parallel formula of Chan, Golub and LeVeque, then var or std; PieceMoments
//    (a part's count, mean and M2), join_moments (two parts), lane_moments (a thread's pieces)
//    and warp_moments (a warp's threads' parts);
//  - their entry points: LINRED_PIECES (linred_pieces_bounds; linred_pieces_join, a warp a
//    segment, and linred_pieces_join_block, a block of BLOCK threads a segment of many
//    pieces).
//
// The join: a warp (or a block) a (row of the batch, segment, feature); its threads take the
// pieces in turn (thread t: pieces t, t + G, ...), each joining its own, then the threads' by a
// fixed tree (the same bits every run).  Two parts (n_a, mean_a, M2_a) and (n_b, mean_b, M2_b) join as
// n = n_a + n_b, d = mean_b - mean_a, mean = mean_a + d n_b / n, M2 = M2_a + M2_b + d^2 n_a n_b / n
// (no E[x^2] - E[x]^2); an empty part leaves the other as it is.  A piece holding a NaN or an
// infinity has a NaN or infinite mean or M2, and the join keeps it (inf - inf: NaN), so the
// segment's var is NaN, as the composition's.  var = M2 / (n - ddof), NaN where n <= ddof.

#pragma once

#include "offsets.cuh"

// thread i of m + 1 + inner: bound i of the segments (i <= m) or multiple i - m of rows.
template <class Off>
__device__ __forceinline__ void pieces_bounds(Off off, i64 n, i64 m, i64 rows, i64 inner, i64* __restrict__ merged,
                                              i64* __restrict__ places) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i <= m + inner; i += stride) {
        if (i <= m) {
            // before bound i: the i bounds before it and the multiples below it (ceil(o / rows) - 1
            // of them, none for o <= 0, all `inner` for o >= n)
            // (clamped to [0, n]: unchecked offsets outside it stay inside the data)
            i64 o = off(i);
            o = o < 0 ? 0 : (o > n ? n : o);
            i64 below = o <= 0 ? 0 : (o - 1) / rows;
            below = below < inner ? below : inner;
            places[i] = i + below;
            merged[i + below] = o;
        } else {
            // before multiple k: the k - 1 multiples below it and the bounds at or below it
            const i64 k = i - m, g = k * rows;
            i64 lo = 0, hi = m + 1;  // (the count of bounds <= g: the first bound above g)
            while (lo < hi) {
                const i64 mid = (lo + hi) / 2;
                if (off(mid) <= g) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            merged[k - 1 + lo] = g;
        }
    }
}

struct PieceMoments {
    double n, mean, m2;
};

// Two parts joined.  A part of infinite mean (float64 data whose piece's sum overflowed, or that
// held an infinity: its M2 is NaN then) makes the join's mean that infinity (NaN for two of
// opposite signs) and its M2 infinite (NaN where either part's is): the composition's mean and
// var where its sum overflows, and NaN where the data holds an infinity.
__device__ __forceinline__ PieceMoments join_moments(PieceMoments a, PieceMoments b) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    const double n = a.n + b.n;
    if (isinf(a.mean) || isinf(b.mean)) {
        const double mean = isinf(a.mean) ? (isinf(b.mean) ? a.mean + b.mean : a.mean) : b.mean;
        return PieceMoments{n, mean, a.m2 + b.m2 + __longlong_as_double(0x7ff0000000000000ll)};
    }
    const double d = b.mean - a.mean;
    return PieceMoments{n, fma(d, b.n / n, a.mean), fma(d * d, a.n * (b.n / n), a.m2 + b.m2)};
}

// The moments of pieces [j, j + G, ...) below end, joined in order, U loads in flight at once
// (the pieces' moments are small and scattered: a lane's loop is bound by the round trips; a
// warp joins one segment's pieces where they are few on average, so a long segment among short
// ones takes one warp about pieces / 256 round trips).
template <int G> __device__ __forceinline__ PieceMoments lane_moments(const double* __restrict__ moments,
                                                                      const i64* __restrict__ merged, i64 j, i64 end,
                                                                      i64 step) {
    constexpr int U = 8;
    PieceMoments acc{0, 0, 0};
    for (; j < end; j += (i64)G * U) {
        PieceMoments v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 k = j + (i64)u * G;
            v[u] = k < end ? PieceMoments{(double)(merged[k + 1] - merged[k]), moments[k * step],
                                          moments[k * step + 1]}
                           : PieceMoments{0, 0, 0};
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc = join_moments(acc, v[u]);
    }
    return acc;
}

// The parts of a warp's lanes joined by a fixed shuffle tree (the lower lane's part first: every
// lane joins the same two parts in the same order), in lane 0 (and every lane).
__device__ __forceinline__ PieceMoments warp_moments(PieceMoments acc, int lane, int width) {
    for (int mask = 1; mask < width; mask <<= 1) {
        const PieceMoments other{__shfl_xor_sync(0xffffffffu, acc.n, mask),
                                 __shfl_xor_sync(0xffffffffu, acc.mean, mask),
                                 __shfl_xor_sync(0xffffffffu, acc.m2, mask)};
        acc = (lane & mask) ? join_moments(other, acc) : join_moments(acc, other);
    }
    return acc;
}

// moments: (batch, pieces, D, 2) doubles; merged: pieces + 1 bounds; places: m + 1; out: (batch,
// m, D).  G threads a (row of the batch, segment, feature): a warp (32), or a block of G for
// segments of many pieces (their lanes' parts joined by the warps' shuffles, then the warps'
// through shared memory by the first warp, in order).  STD: the root of the variance.
template <class O, bool STD, int G>
__device__ __forceinline__ void pieces_join(const double* __restrict__ moments, const i64* __restrict__ merged,
                                            const i64* __restrict__ places, O* __restrict__ out, i64 batch, i64 m,
                                            i64 D, double ddof) {
    static_assert(G == 32 || (G % 32 == 0 && G <= 1024), "a warp, or a block of whole warps");
    __shared__ double parts[G == 32 ? 1 : 3 * (G / 32)];
    const int t = threadIdx.x % G, lane = threadIdx.x & 31;
    const i64 groups = (i64)gridDim.x * (blockDim.x / G), pieces = places[m];
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / G; w < batch * m * D; w += groups) {
        const i64 f = w % D, bs = w / D, s = bs % m, b = bs / m;
        PieceMoments acc = lane_moments<G>(moments + (b * pieces * D + f) * 2, merged, places[s] + t,
                                           places[s + 1], 2 * D);
        acc = warp_moments(acc, lane, 32);
        if constexpr (G > 32) {
            const int warp = t / 32;
            if (lane == 0) {
                parts[3 * warp] = acc.n;
                parts[3 * warp + 1] = acc.mean;
                parts[3 * warp + 2] = acc.m2;
            }
            __syncthreads();
            if (warp == 0) {
                acc = lane < G / 32 ? PieceMoments{parts[3 * lane], parts[3 * lane + 1], parts[3 * lane + 2]}
                                    : PieceMoments{0, 0, 0};
                acc = warp_moments(acc, lane, G / 32);
            }
            __syncthreads();  // (the parts are written again by the next segment's warps)
        }
        if (t == 0) {
            double var = __longlong_as_double(0x7ff8000000000000ll);
            if (acc.n > ddof) {
                var = acc.m2 / (acc.n - ddof);
                // (finite pieces whose sum overflows float64: the composition's mean, and so its var,
                // is infinite; Chan's mean of their means is not)
                if (isfinite(acc.mean) && isinf(acc.mean * acc.n) && !isnan(var)) {
                    var = __longlong_as_double(0x7ff0000000000000ll);
                }
            }
            if (STD) var = sqrt(var);
            out[bs * D + f] = finish<O, false>(var, 1);
        }
    }
}

// ---- entry points -------------------------------------------------------------------
// OFFSETS: FixedOffsets{L} or ArrayOffsets<I>{offsets} (the call's segments); O: the result's C
// type; STD: true for std; BLOCK: linred_pieces_join_block's threads.  ddof: the bits of a double.
#define LINRED_PIECES(I, OFFSETS, O, STD, BLOCK)                                                                       \
    extern "C" __global__ void linred_pieces_bounds(const I* offsets, long long L, long long n, long long m,    \
                                                    long long rows, long long inner, long long* merged,         \
                                                    long long* places) {                                        \
        pieces_bounds(OFFSETS, n, m, rows, inner, merged, places);                                             \
    }                                                                                                          \
    extern "C" __global__ void linred_pieces_join(const double* moments, const long long* merged,              \
                                                  const long long* places, O* out, long long batch,            \
                                                  long long m, long long d, long long ddof) {                  \
        pieces_join<O, STD, 32>(moments, merged, places, out, batch, m, d, __longlong_as_double(ddof));        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                                        \
        linred_pieces_join_block(const double* moments, const long long* merged, const long long* places,     \
                                 O* out, long long batch, long long m, long long d, long long ddof) {          \
        pieces_join<O, STD, BLOCK>(moments, merged, places, out, batch, m, d,                                  \
                                          __longlong_as_double(ddof));                                         \
    }
