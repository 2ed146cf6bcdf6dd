// softmax_grad: the derivatives of segmented logsumexp, softmax, log_softmax, var and std in one
// kernel (the backward of linred/_fused_grad.py's FusedGrad, where it serves the call).
//
// Holds:
//  - softmax_grad: each (row of the batch, segment) is one worker, as in softmax_family
//    (softmax.cuh): G lanes of a warp (32, or fewer for short segments) where the features D are
//    a power of two up to G (lane l reads row l / D of each step of G / D rows, feature l % D; the
//    groups of a warp loop together, those past the last worker on an empty segment), else one
//    thread per (row of the batch, segment, feature) (G = 1).  With g the gradient of the result and, per segment, S a
//    sum over its rows (in double, the lanes added by a fixed shuffle tree: the same bits every
//    run), a worker writes each element's derivative dx:
//      logsumexp   (MODE 0)  dx = exp(x - r) * g                        r, g: the segment's
//      softmax     (MODE 1)  dx = y * (g - S),    S = sum of g * y      y, g: the element's
//      log_softmax (MODE 2)  dx = g - exp(y) * S, S = sum of g
//      var         (MODE 3)  dx = (x - mean) * 2 g / (n - ddof),         mean = S / n, S = sum of x;
//                            0 where n <= ddof
//      std         (MODE 4)  dx = (x - mean) * g / ((n - ddof) s),       s: the segment's std;
//                            0 where n <= ddof or s is 0 (a NaN s gives NaN)
//    which are linred/_fused_grad.py's formulas (the composition's derivatives; torch.var's and
//    torch.std's for var and std).  Reads each segment once (logsumexp) or twice (the second
//    mostly from L1/L2), writes it once; every element belongs to one segment, so dx is written
//    whole.  The offsets are not checked: the forward checked them;
//  - grad_segment: one worker's segment;
//  - grad_lanes_sum: the sum of the lanes that share a feature;
//  - its entry point: LINRED_SOFTMAX_GRAD (linred_softmax_grad);
//  - grad_from_parts: the same derivatives of long segments of one feature from per-segment
//    values (GradFromParts, GradPart, GradValues), its entry point LINRED_GRAD_FROM_PARTS
//    (linred_grad_from_parts).

#pragma once

#include "offsets.cuh"

enum { GRAD_LOGSUMEXP = 0, GRAD_SOFTMAX = 1, GRAD_LOG_SOFTMAX = 2, GRAD_VAR = 3, GRAD_STD = 4 };

// The sum of the lanes of a worker of G lanes that share a feature (lanes lane ^ o for DW <= o <
// G), added by a fixed tree.
template <int G, int DW> __device__ __forceinline__ double grad_lanes_sum(double v) {
#pragma unroll
    for (int o = G / 2; o >= DW; o /= 2) v += shfl_xor(v, o);
    return v;
}

// One worker's segment [begin, end) of row b of the batch (bs: row of the batch * m + segment; d:
// a thread's feature where G = 1): its derivatives (an empty segment reads and writes nothing).
// Every lane of the worker calls it (the shuffles need them all).
template <class TA, class R, class DX, class C, int MODE, int G, int DW>
__device__ __forceinline__ void grad_segment(const TA* __restrict__ a, const R* __restrict__ g,
                                             const R* __restrict__ res, DX* __restrict__ dx, i64 n, i64 D, i64 b,
                                             i64 bs, i64 d, i64 begin, i64 end, double ddof) {
    constexpr int RS = G / DW;  // rows a step of the worker's lanes
    if (G > 1) D = DW;          // (the same value, known to the compiler)
    const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
    const int r0 = lane / DW;  // the lane's first row in a step
    if (G > 1) d = lane % DW;  // the lane's feature
    const i64 base = b * n * D + d;  // element (row i, the lane's feature) of row b: base + i * D
    const i64 one = bs * D + d;      // the segment's value in g and res (MODE 0, 3, 4)
    double sum = 0;
    if constexpr (MODE != GRAD_LOGSUMEXP) {
#pragma unroll 4
        for (i64 i = begin + r0; i < end; i += RS) {
            const i64 e = base + i * D;
            if constexpr (MODE == GRAD_SOFTMAX) {
                sum += (double)to_acc<C>(g[e]) * (double)to_acc<C>(a[e]);
            } else if constexpr (MODE == GRAD_LOG_SOFTMAX) {
                sum += (double)to_acc<C>(g[e]);
            } else {
                sum += (double)to_acc<C>(a[e]);
            }
        }
        if (G > 1) sum = grad_lanes_sum<G, DW>(sum);
    }
    if constexpr (MODE == GRAD_SOFTMAX || MODE == GRAD_LOG_SOFTMAX) {
        const C S = (C)sum;
#pragma unroll 4
        for (i64 i = begin + r0; i < end; i += RS) {
            const i64 e = base + i * D;
            const C y = to_acc<C>(a[e]), ge = to_acc<C>(g[e]);
            const C v = MODE == GRAD_SOFTMAX ? y * (ge - S) : ge - exp(y) * S;
            dx[e] = Store<DX>::from(v);
        }
    } else if (begin < end) {
        const C ge = to_acc<C>(g[one]);
        C shift, scale;  // dx = f(x - shift) * scale
        if constexpr (MODE == GRAD_LOGSUMEXP) {
            shift = to_acc<C>(res[one]);
            scale = ge;
        } else {
            const double count = (double)(end - begin), free = count - ddof;
            shift = (C)(sum / count);
            if constexpr (MODE == GRAD_VAR) {
                scale = free > 0 ? (C)(2.0 * (double)ge / free) : (C)0;
            } else {
                const double sd = (double)to_acc<C>(res[one]);
                scale = free > 0 && sd != 0 ? (C)((double)ge / (free * sd)) : (C)0;
            }
        }
#pragma unroll 4
        for (i64 i = begin + r0; i < end; i += RS) {
            const i64 e = base + i * D;
            const C t = to_acc<C>(a[e]) - shift;
            dx[e] = Store<DX>::from(MODE == GRAD_LOGSUMEXP ? exp(t) * scale : t * scale);
        }
    }
}

// a: the data x (MODE 0, 3, 4) or the result y (1, 2), (batch, n, D) C-contiguous; g: the
// result's gradient, like y (1, 2) or one value per (row of the batch, segment, feature) (0, 3,
// 4), as res, the segment's result (0: logsumexp, 4: std; unused otherwise); dx: like x.  C: the
// type the elementwise steps compute in (float, or double for float64).  Workers as
// softmax_family's (softmax.cuh): the warp loops over its workers together, and a group's (or,
// for one feature, a thread's) segment longer than a warp's loop step of rows (8 steps of 32 /
// D) is read by the whole warp instead.
template <class TA, class R, class DX, class C, int MODE, int G, int DW, class Off>
__device__ __forceinline__ void softmax_grad(const TA* __restrict__ a, const R* __restrict__ g,
                                             const R* __restrict__ res, DX* __restrict__ dx, Off off, i64 n, i64 m,
                                             i64 D, i64 workers, double ddof) {
    static_assert(G == 1 || (G <= 32 && DW <= G && 32 % G == 0), "a worker is a thread or a group of a warp's lanes");
    const i64 stride = (i64)gridDim.x * (blockDim.x / G);
    // the worker's place in its warp: the warp loops while its first worker has a segment
    constexpr bool GROUPS = G < 32;
    const int place = GROUPS ? (int)((threadIdx.x & 31) / G) : 0;
    const i64 longest = G == 1 && D != 1 ? Limits<i64>::highest() : (i64)(8 * 32 / DW);
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / G; w - place < workers; w += stride) {
        const bool valid = !GROUPS || w < workers;  // (a worker past the last one reads nothing)
        const i64 bs = G == 1 ? w / D : w;          // row of the batch * m + segment
        const i64 b = bs / m, s = bs - b * m;
        const i64 begin = valid ? off(s) : 0, end = valid ? off(s + 1) : 0;
        const bool whole = GROUPS && end - begin > longest;  // (read by the whole warp, below)
        grad_segment<TA, R, DX, C, MODE, G, DW>(a, g, res, dx, n, D, b, bs, G == 1 ? w % D : 0, whole ? 0 : begin,
                                                whole ? 0 : end, ddof);
        if constexpr (GROUPS) {  // the long segments of this warp's workers, by the whole warp
            warp_takes_long_segments<G>(whole, b, bs, begin, end, [&](i64 wb, i64 wbs, i64 wbegin, i64 wend) {
                grad_segment<TA, R, DX, C, MODE, 32, DW>(a, g, res, dx, n, D, wb, wbs, 0, wbegin, wend, ddof);
            });
        }
    }
}

// ---- long segments of one feature: from per-segment values -----------------------------------
// grad_from_parts: the same derivatives where softmax_grad's workers would each read a long
// segment alone (few segments, or long ones on average), for one feature column: `rows` rows of
// n values walked by offsets.cuh's segment_chunks (GradFromParts its body), each value with its
// segment's shift and scale (GradPart, made by the block's first thread from per-segment values;
// GradValues an element's a and g):
//      logsumexp   (MODE 0)  dx = exp(x - r) * g      r, g: the segment's (res, g)
//      softmax     (MODE 1)  dx = y * (g - p)         p: the sum of g * y  (linred's sums, which
//      log_softmax (MODE 2)  dx = g - exp(y) * p      p: the sum of g       spread a segment over
//      var, std    (MODE 3, 4) dx = (x - p) * scale   p: the mean           the whole GPU)
// with softmax_grad's scale for var and std (from the segment's count, g and, for std, res).
// The offsets are not checked.
template <class C> struct GradPart {
    C shift, scale;
};
template <class C> struct GradValues {
    C a, g;
};
template <class TA, class R, class DX, class C, int MODE, class Off> struct GradFromParts {  // (segment_chunks' Body)
    typedef GradPart<C> P;
    typedef GradValues<C> V;
    static constexpr bool PER_ELEMENT = MODE == GRAD_SOFTMAX || MODE == GRAD_LOG_SOFTMAX;
    const TA* __restrict__ a;
    const R* __restrict__ g;    // per element (softmax, log_softmax), else per segment
    const R* __restrict__ res;  // the result per segment (logsumexp, std)
    const C* __restrict__ p;    // per segment (softmax, log_softmax, var, std)
    DX* __restrict__ dx;
    Off off;
    i64 n, segments;
    double ddof;
    __device__ __forceinline__ P part(i64 r, i64 s) const {
        const i64 k = r * segments + s;
        P v;
        if constexpr (MODE == GRAD_LOGSUMEXP) {
            v.shift = to_acc<C>(res[k]);
            v.scale = to_acc<C>(g[k]);
        } else if constexpr (PER_ELEMENT) {
            v.shift = p[k];
            v.scale = C(0);
        } else {
            const double free = (double)(off(s + 1) - off(s)) - ddof, ge = (double)to_acc<C>(g[k]);
            v.shift = p[k];
            if constexpr (MODE == GRAD_VAR) {
                v.scale = free > 0 ? (C)(2.0 * ge / free) : C(0);
            } else {
                const double sd = (double)to_acc<C>(res[k]);
                v.scale = free > 0 && sd != 0 ? (C)(ge / (free * sd)) : C(0);
            }
        }
        return v;
    }
    __device__ __forceinline__ V load(i64 r, i64 i) const {
        V v;
        v.a = to_acc<C>(a[r * n + i]);
        v.g = PER_ELEMENT ? to_acc<C>(g[r * n + i]) : C(0);
        return v;
    }
    __device__ __forceinline__ void write(i64 r, i64 i, const P& s, V v) const {
        C d;
        if constexpr (MODE == GRAD_LOGSUMEXP) {
            d = exp(v.a - s.shift) * s.scale;
        } else if constexpr (MODE == GRAD_SOFTMAX) {
            d = v.a * (v.g - s.shift);
        } else if constexpr (MODE == GRAD_LOG_SOFTMAX) {
            d = v.g - exp(v.a) * s.shift;
        } else {
            d = (v.a - s.shift) * s.scale;
        }
        dx[r * n + i] = Store<DX>::from(d);
    }
};

// ---- entry point --------------------------------------------------------------------
// linred_softmax_grad: softmax_grad; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}; ddof: the
// bits of a double (var and std; the other modes ignore it).
#define LINRED_SOFTMAX_GRAD(TA, R, DX, C, MODE, G, DW, THREADS, I, OFFSETS)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        linred_softmax_grad(const TA* a, const R* g, const R* res, DX* dx, const I* offsets, long long L,     \
                            long long n, long long m, long long d, long long workers, long long ddof) {      \
        static_assert(THREADS % 32 == 0, "a block is whole warps");                                           \
        softmax_grad<TA, R, DX, C, MODE, G, DW>(a, g, res, dx, OFFSETS, n, m, d, workers,                     \
                                                 __longlong_as_double(ddof));                                 \
    }

// linred_grad_from_parts: grad_from_parts; OFFSETS and ddof as linred_softmax_grad's.
#define LINRED_GRAD_FROM_PARTS(TA, R, DX, C, MODE, THREADS, ITEMS, I, OFFSETS)                                 \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        linred_grad_from_parts(const TA* a, const R* g, const R* res, const C* p, DX* dx, const I* offsets,   \
                               long long L, long long rows, long long n, long long m, long long ddof) {      \
        const auto off = OFFSETS;                                                                            \
        const GradFromParts<TA, R, DX, C, MODE, decltype(off)> body{a,   g,    res, p, dx,                   \
                                                                   off, n, m, __longlong_as_double(ddof)};  \
        segment_chunks<THREADS, ITEMS>(off, rows, n, m, body);                                               \
    }
