// softmax_family: segmented logsumexp, softmax, log_softmax, var and std in one kernel.
//
// Holds:
//  - softmax_family: each (row of the batch, segment) is one worker: G lanes of a warp where
//    the features D are a power of two up to G (the lanes cover G / D rows of D features: every
//    load is G consecutive elements), G = 32 for long segments and as few as 2 (or a thread, for
//    one feature) for short ones, so that a warp reads several short segments at once instead of
//    leaving most of its lanes idle (64M float32 values in segments of mean 16 rows on an H200:
//    logsumexp 1,173 us with a warp, 151 with 2 lanes); else one thread per (row of the batch,
//    segment, feature) (G = 1: neighbouring threads read neighbouring features of a row).  A worker
//    reads its segment for the maximum, again for the sum of exp(x - shift) and, for softmax
//    and log_softmax, a third time to write each element (the later reads mostly from L1/L2:
//    a single pass with a running maximum that rescales the sum was slower on an H100, its
//    merge across lanes costing more exps than it saved reads);
//    var and std (SOFTMAX_VAR, SOFTMAX_STD) of data and results narrower than 8 bytes read a
//    segment once, summing its deviations from its first value and their squares in double
//    (variance_one_pass: the shifted-data formula, exact differences); of float64, twice: for its
//    mean, then for the sum of the squared deviations from it (never E[x^2] - E[x]^2);
//    A worker's passes load UNROLL steps of its lanes at once (load_steps), so that a segment
//    of a few hundred rows costs one or two round trips to memory: a warp takes whole steps
//    without a test per row, then one partial step (each_step); softmax's writes end in single
//    steps, so that no lane computes an exp past the segment's end; a group reads its next
//    segment's bounds before this one's rows, and its first pass over a long segment asks L2
//    for the lines SOFTMAX_AHEAD steps ahead of its loads (prefetch_step).  On an H100 the
//    kernel is bound by the instructions it issues (ncu), not by memory, so the per-element
//    work is kept short: float16 and bfloat16 data of one feature, aligned for it, is read two
//    rows a load by each lane (P = 2: load_pairs, a Pair of values; softmax_rows_a_step gives
//    the rows a step of the lanes covers), and softmax's results written two a store;
//  - variance, variance_one_pass: var and std of a worker's segment (shifted_sums: the sums of
//    its deviations from a shift and of their squares, once, or twice for a segment of more
//    than 2^20 rows, the second shifted by the first's mean); or, in the moments modes
//    (SOFTMAX_MOMENTS, SOFTMAX_MOMENTS_EXACT: moments_mode, variance_mode), its mean and sum of
//    squared deviations (write_moments), for linred/_pieces.py's pieces of long segments;
//  - load_steps: a lane's UNROLL steps, rows past the end read as a fill value; load_pairs: the
//    same from pairs of rows; each_step: one pass over a segment in such steps (nan_max and
//    sum_exp, which it takes from common.cuh, keep the instructions per element few: the kernel's
//    work is mostly the instructions it issues);
//  - family_segment: one worker's segment (its passes and results);
//  - lanes_max and lanes_sum: the maximum and the sum of a worker's lanes that share a feature
//    (block_lanes: for a worker of a whole block);
//  - softmax_long: segments longer than SOFTMAX_LONG_ROWS, which the workers' warps list
//    (list_long, into a LongList of LongSegment) instead of reading them, in large calls and
//    checked ones, each read by a whole block in a second kernel: one far longer than the others
//    kept one warp busy for the rest of the call;
//  - its entry points: LINRED_SOFTMAX (linred_softmax), LINRED_SOFTMAX_LONG (linred_softmax_long).
//
// The results are those of linred's composition (linred/_fused.py), by the same formulas: the
// shift is the segment's maximum, or 0 where that is not finite (logsumexp) or is -inf (softmax,
// log_softmax); logsumexp = log(sum) + shift, softmax = exp(x - shift) / sum, log_softmax =
// (x - shift) - log(sum), with sum the sum of exp(x - shift).  So a segment holding NaN gives
// NaN, one holding +inf gives +inf (logsumexp) or NaN, an all -inf or empty one -inf
// (logsumexp) or NaN.  Sums in A (float32 for 16-bit and float32 data, float64 for float64; a
// lane adds its loop steps' sums of exps in double); var and std: float64 for every dtype;
// lanes are added by a fixed shuffle tree: the same bits every run.  var = (sum of (x - mean)^2)
// / (length - ddof), NaN where length <= ddof (an empty segment too) and, through inf - inf or
// NaN, where the segment holds an infinity or a NaN; std = sqrt(var), as the composition's.

#pragma once

#include "offsets.cuh"

// Loop steps ahead of its loads that a warp's first pass over a long segment asks L2 for
// (prefetch_step), so that its loads wait for L2, not for memory.
constexpr int SOFTMAX_AHEAD = 4;

// Steps of a worker's lanes loaded at once (load_steps): 8 for a warp over 2- and 4-byte data,
// else 4 (about 1 KiB a step for a warp; more registers than that cost occupancy or spill).
template <class T, int G> __device__ constexpr int softmax_unroll() { return G > 1 && sizeof(T) <= 4 ? 8 : 4; }

// Rows a step of a worker's lanes covers: 32 / DW for a warp (lanes of DW features each), 1 for a
// thread, 64 for a warp whose lanes read pairs of rows (P = 2: 16-bit data of one feature, two
// values a 4-byte load: the kernel issues an instruction per load, so a float16 value cost a
// float32 value's loads for half its bytes).
template <int G, int DW, int P> __device__ constexpr int softmax_rows_a_step() { return P == 2 ? 64 : G / DW; }

enum { SOFTMAX_LOGSUMEXP = 0, SOFTMAX_SOFTMAX = 1, SOFTMAX_LOG_SOFTMAX = 2, SOFTMAX_VAR = 3, SOFTMAX_STD = 4,
       SOFTMAX_MOMENTS = 5, SOFTMAX_MOMENTS_EXACT = 6 };

// Whether MODE computes var and std's sums.  The moments modes write a segment's mean and sum of
// squared deviations from it, two doubles a (segment, feature), for var and std of segments cut
// into pieces (linred/_pieces.py and pieces.cuh join the pieces' moments): SOFTMAX_MOMENTS by one pass over
// float16, bfloat16 and float32 data (variance_one_pass, for a result of that width),
// SOFTMAX_MOMENTS_EXACT by the mean's pass and the deviations' (float64 data or result).
template <int MODE> __device__ constexpr bool moments_mode() {
    return MODE == SOFTMAX_MOMENTS || MODE == SOFTMAX_MOMENTS_EXACT;
}
template <int MODE> __device__ constexpr bool variance_mode() {
    return MODE == SOFTMAX_VAR || MODE == SOFTMAX_STD || moments_mode<MODE>();
}

// A moments mode's pair at q: the mean and the sum of squared deviations m2 of a segment of
// count values (0 and 0 for an empty segment).
template <class O>
__device__ __forceinline__ void write_moments(O* __restrict__ q, double count, double mean, double m2) {
    q[0] = Store<O>::from(count > 0 ? mean : 0.0);  // (Store: any result type, as the others write)
    q[1] = Store<O>::from(count > 0 ? m2 : 0.0);
}

// The maximum and the sum of the lanes of a worker of G lanes that share a feature (lanes lane ^ o
// for DW <= o < G), added by a fixed tree.  Every lane of the warp calls them (the groups of a
// warp together).
// A worker of a whole block (G > 32: block_lanes) adds its warps' values through shared memory,
// in the order of the warps; every thread of the block calls them.
template <int G, int DW, bool SUM, class A> __device__ __forceinline__ A block_lanes(A v) {
    static_assert(G % 32 == 0 && DW <= 32, "a block's worker is whole warps");
#pragma unroll
    for (int o = 16; o >= DW; o /= 2) v = SUM ? v + shfl_xor(v, o) : OpMax::combine(v, shfl_xor(v, o));
    __shared__ A part[G / 32][32];
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    if (lane < DW) part[warp][lane] = v;
    __syncthreads();
    v = part[0][lane % DW];
#pragma unroll
    for (int k = 1; k < G / 32; ++k) v = SUM ? v + part[k][lane % DW] : OpMax::combine(v, part[k][lane % DW]);
    __syncthreads();  // (part is written again by the next call)
    return v;
}
template <int G, int DW, class A> __device__ __forceinline__ A lanes_max(A v) {
    if constexpr (G > 32) {
        return block_lanes<G, DW, false>(v);
    } else {
#pragma unroll
        for (int o = G / 2; o >= DW; o /= 2) v = OpMax::combine(v, shfl_xor(v, o));
        return v;
    }
}
template <int G, int DW, class A> __device__ __forceinline__ A lanes_sum(A v) {
    if constexpr (G > 32) {
        return block_lanes<G, DW, true>(v);
    } else {
#pragma unroll
        for (int o = G / 2; o >= DW; o /= 2) v += shfl_xor(v, o);
        return v;
    }
}

// UNROLL steps of a lane from row i of p (RS rows a step) into v, as A; with FULL every row is
// read, else rows at or past end read as `fill`.  (p and end are the lane's: its first row's
// address, and the segment's end less that row, so that i, the worker's step, is the same for
// every lane.)  A step issues all its loads at once: a segment of a few hundred rows is one or
// two round trips to memory, not one per step.
template <int UNROLL, int RS, bool FULL, class T, class A>
__device__ __forceinline__ void load_steps(const T* __restrict__ p, i64 i, i64 end, i64 D, A fill, A (&v)[UNROLL]) {
    const T* __restrict__ row = p + i * D;
    const int left = FULL ? UNROLL * RS : (int)min(end - i, (i64)(UNROLL * RS));  // (32-bit compares below)
    const i64 step = RS * D;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u, row += step) v[u] = FULL || u * RS < left ? to_acc<A>(*row) : fill;
}

// Two 16-bit values in one 4-byte load, or two results in one store (where the worker reads
// pairs of rows: softmax_pairs).
template <class T> struct Pair { struct __align__(2 * sizeof(T)) type { T a, b; }; };

// load_steps for a warp whose lanes read pairs of rows (P = 2: 16-bit data, one feature): UNROLL
// values of a lane from UNROLL / 2 pairs, rows i + u RS and i + u RS + 1 of p (RS = 64: the lanes
// cover 64 consecutive rows), each pair one 4-byte load.  i is even, and so is p's row (the
// pair's address is 4-byte aligned).  With MASKED, rows before first or at or past last read as
// `fill`, a pair with no row in [first, last) is not read, and one whose second row lies at or
// past nlast (the data's end) is read as one value: a pair may straddle a segment's bounds, never
// the data's end.  (first, last, nlast: the segment's bounds and the data's end less the lane's
// first row, as load_steps takes `end`.)
template <int UNROLL, int RS, bool MASKED, class T, class A>
__device__ __forceinline__ void load_pairs(const T* __restrict__ p, i64 i, i64 first, i64 last, i64 nlast, A fill,
                                           A (&v)[UNROLL]) {
    typedef typename Pair<T>::type P2;
    static_assert(UNROLL % 2 == 0, "pairs of rows");
    constexpr int SR = UNROLL / 2 * RS;
    const T* __restrict__ row = p + i;
    if (!MASKED) {
#pragma unroll
        for (int u = 0; u < UNROLL / 2; ++u) {
            const P2 w = *reinterpret_cast<const P2*>(row + u * RS);
            v[2 * u] = to_acc<A>(w.a);
            v[2 * u + 1] = to_acc<A>(w.b);
        }
        return;
    }
    // rows relative to i, as 32-bit values: row k is in the segment iff lo <= k < hi
    const int lo = (int)max(first - i, (i64)-2), hi = (int)min(last - i, (i64)SR);
    const int mem = (int)min(nlast - i, (i64)SR + 2);
#pragma unroll
    for (int u = 0; u < UNROLL / 2; ++u) {
        const int k = u * RS;
        A a = fill, b = fill;
        if (k < hi && k + 1 >= lo) {
            if (k + 1 < mem) {
                const P2 w = *reinterpret_cast<const P2*>(row + k);
                a = to_acc<A>(w.a);
                b = to_acc<A>(w.b);
            } else {
                a = to_acc<A>(row[k]);
            }
            if (k < lo) a = fill;
            if (k + 1 >= hi) b = fill;
        }
        v[2 * u] = a;
        v[2 * u + 1] = b;
    }
}

// The lanes of a warp ask L2 for the 128-byte lines of the loop step of SR rows from row a of
// `rows` (D elements a row; rows past end left out), lane k for the k-th line (a step is at
// most 9 lines).  The lines lie within the step's bytes (the first rounded down to its line).
template <int SR, class T>
__device__ __forceinline__ void prefetch_step(const T* rows, i64 a, i64 end, i64 D, int lane) {
    if (a >= end) return;
    const unsigned long long first = (unsigned long long)(rows + a * D) & ~127ull;
    const unsigned long long line = first + 128ull * (unsigned)lane;
    if (line < (unsigned long long)(rows + min(a + SR, end) * D)) asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
}

// One pass of a worker over its segment [begin, end): f(v) for each loop step's UNROLL values of
// the lane (p, last: the lane's first row and end, as load_steps takes them).  A warp (G > 1)
// takes whole steps without a test per row, then at most one partial step whose rows past the
// end read as `fill`: the kernel's work is mostly the instructions it issues per element, so they
// are few.  A thread per feature (G = 1) tests every row: the threads of its warp read different
// segments, and a second loop for their partial steps would run once for each group of them.
// With P = 2 the lanes read pairs of rows (load_pairs; first and nlast: the segment's start and
// the data's end less the lane's first row): the steps start at the even row at or before begin,
// so a segment that starts at an odd row begins with a partial step too.
template <int UNROLL, int RS, int G, int AHEAD = 0, int P = 1, class T, class A, class F>
__device__ __forceinline__ void each_step(const T* __restrict__ p, i64 begin, i64 end, i64 last, i64 D, A fill, F f,
                                          const T* rows = nullptr, int lane = 0, i64 first = 0, i64 nlast = 0) {
    if constexpr (P == 2) {
        constexpr int SR = UNROLL / 2 * RS;
        i64 i = begin & ~(i64)1;
        if (i < begin) {
            A v[UNROLL];
            load_pairs<UNROLL, RS, true>(p, i, first, last, nlast, fill, v);
            f(v);
            i += SR;
        }
        for (; i + SR <= end; i += SR) {
            if constexpr (AHEAD > 0) prefetch_step<SR>(rows, i + AHEAD * SR, end, D, lane);
            A v[UNROLL];
            load_pairs<UNROLL, RS, false>(p, i, first, last, nlast, fill, v);
            f(v);
        }
        if (i < end) {
            A v[UNROLL];
            load_pairs<UNROLL, RS, true>(p, i, first, last, nlast, fill, v);
            f(v);
        }
        return;
    }
    constexpr int SR = UNROLL * RS;
    i64 i = begin;
    for (; G > 1 && i + SR <= end; i += SR) {  // (none for G = 1)
        if constexpr (AHEAD > 0) prefetch_step<SR>(rows, i + AHEAD * SR, end, D, lane);
        A v[UNROLL];
        load_steps<UNROLL, RS, true>(p, i, last, D, fill, v);
        f(v);
    }
    if constexpr (G > 1) {
        if (i < end) {
            A v[UNROLL];
            load_steps<UNROLL, RS, false>(p, i, last, D, fill, v);
            f(v);
        }
    } else {
        for (; i < end; i += SR) {
            A v[UNROLL];
            load_steps<UNROLL, RS, false>(p, i, last, D, fill, v);
            f(v);
        }
    }
}

// float16, bfloat16 and float32: the data variance_one_pass serves (exact in double, and so are
// their differences but for values 2^29 times apart).
template <class T> struct IsNarrowFloat { static constexpr bool value = false; };
template <> struct IsNarrowFloat<float> { static constexpr bool value = true; };
template <> struct IsNarrowFloat<half_t> { static constexpr bool value = true; };
template <> struct IsNarrowFloat<bf16_t> { static constexpr bool value = true; };

// var and std of a worker's segment [begin, end) of float16, bfloat16 or float32 data, and a
// result narrower than 8 bytes, in one pass: with K the segment's first value (each lane: its
// feature's), S1 = sum of (x - K) and S2 = sum of (x - K)^2 in double, var = (n S2 - S1^2) /
// (n (n - ddof)) (the shifted-data formula).  A value and x - K are exact in double (but for
// values 2^29 times apart), so only the sums round, their error magnified by 1 + (mean - K)^2 /
// var_n (at most n, where K is the segment's extreme outlier): about n^1.5 2^-53 at worst, below
// a float32 result's rounding up to about 2^21 rows (an emulation of the kernel's order, the
// first value an outlier: 0 ulp at 10^6 rows, 1 ulp at 10^7, 8 ulp (6.5e-7) at 3 10^7), so a
// segment over 2^20 rows is read a second time, shifted by the mean the first pass gave (K + S1/n,
// rounded to float: the magnification is then about 1).  One read of the data
// and about 5 instructions a value, against two reads and 7 for variance's two passes (the kernel
// is bound by the instructions it issues: 118 against 127 us for 64M float32 values on an H100).
// An infinity or a NaN among the values makes S1 or S2 so, and the result NaN (inf - inf, or
// NaN), as the composition's.

// The sums of x - K and (x - K)^2 of a worker's segment (every lane's after the shuffles).
template <class T, int G, int DW, int UNROLL, int P>
__device__ __forceinline__ void shifted_sums(const T* __restrict__ p, i64 begin, i64 end, i64 n, i64 D, int r0,
                                             float kf, const T* rows, int lane, double& s1, double& s2) {
    constexpr int RS = softmax_rows_a_step<G, DW, P>();
    const i64 last = end - r0;
    const double k = kf;
    s1 = 0;
    s2 = 0;
    // rows past the end read as K: they add 0 to both sums
    each_step<UNROLL, RS, G, SOFTMAX_AHEAD, P>(
        p, begin, end, last, D, kf,
        [&](float(&v)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const double d = (double)v[u] - k;
                s1 += d;
                s2 = fma(d, d, s2);
            }
        },
        rows, lane, begin - r0, n - r0);
    if (G > 1) {
        s1 = lanes_sum<G, DW>(s1);
        s2 = lanes_sum<G, DW>(s2);
    }
}

template <class T, class O, int MODE, int G, int DW, int UNROLL, int P>
__device__ __forceinline__ void variance_one_pass(const T* __restrict__ p, O* __restrict__ q, i64 begin, i64 end,
                                                  i64 n, i64 D, int r0, double ddof, const T* rows, int lane) {
    // K, the value of row begin in the lane's feature, as a float (exact: T is at most a float;
    // p: the lane's first row)
    float kf = begin < end ? to_acc<float>(p[(begin - r0) * D]) : 0.0f;
    double s1, s2;
    shifted_sums<T, G, DW, UNROLL, P>(p, begin, end, n, D, r0, kf, rows, lane, s1, s2);
    bool again = end - begin > (1 << 20);  // long: again, shifted by the mean
    // (the groups of a warp together: the shuffles of the sums need every lane of the warp; a
    // group's segment is shifted by its mean then, which changes nothing but its rounding)
    if constexpr (G > 1 && G < 32) again = __any_sync(0xffffffffu, again);
    if (again) {
        kf = (float)((double)kf + s1 / (double)(end - begin));
        shifted_sums<T, G, DW, UNROLL, P>(p, begin, end, n, D, r0, kf, rows, lane, s1, s2);
    }
    if (q != nullptr && r0 == 0) {
        // var = (n S2 - S1^2) / (n (n - ddof)): one division (n (n - ddof) is within a rounding of
        // its value); NaN where n <= ddof, and where the data held an infinity or a NaN
        const double count = (double)(end - begin);
        if constexpr (moments_mode<MODE>()) {
            // (the mean K + S1 / n; the sum of squared deviations (n S2 - S1^2) / n)
            const double m2 = fma(s2, count, -(s1 * s1));
            write_moments<O>(q, count, (double)kf + s1 / count, (m2 < 0 ? 0.0 : m2) / count);
        } else {
            double var = (double)__longlong_as_double(0x7ff8000000000000ll);
            if (count > ddof) {
                const double m2 = fma(s2, count, -(s1 * s1));
                var = (m2 < 0 ? 0.0 : m2) / (count * (count - ddof));  // (m2 < 0 only by rounding, where var is ~0)
            }
            if (MODE == SOFTMAX_STD) var = sqrt(var);
            *q = finish<O, false>(var, 1);
        }
    }
}

// var and std of a worker's segment [begin, end) (every lane calls; lane r0 == 0 writes): data
// and results narrower than 8 bytes in one pass (variance_one_pass); else the mean, then the
// squared deviations from it, summed in A (double).
template <class T, class A, class O, int MODE, int G, int DW, int UNROLL, int P>
__device__ __forceinline__ void variance(const T* __restrict__ p, O* __restrict__ q, i64 begin, i64 end, i64 n,
                                         i64 D, int r0, double ddof, const T* rows, int lane) {
    if constexpr (IsNarrowFloat<T>::value && (sizeof(O) < 8 || MODE == SOFTMAX_MOMENTS)) {
        variance_one_pass<T, O, MODE, G, DW, UNROLL, P>(p, q, begin, end, n, D, r0, ddof, rows, lane);
        return;
    }
    constexpr int RS = softmax_rows_a_step<G, DW, P>();
    const i64 last = end - r0, first = begin - r0, nlast = n - r0;  // (p: the lane's first row)
    A s = 0;
    each_step<UNROLL, RS, G, SOFTMAX_AHEAD, P>(
        p, begin, end, last, D, (A)0,
        [&](A(&v)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) s += v[u];
        },
        rows, lane, first, nlast);
    if (G > 1) s = lanes_sum<G, DW>(s);
    const A count = (A)(end - begin);
    const A mean = s / count;  // (0 / 0 for an empty segment: its result is NaN below anyway)
    A ss = 0;
    // Rows past the end read as the mean and add (mean - mean)^2 = 0.  Where float64 data's sum
    // overflows, the mean is +-inf and every row adds inf (the composition's var is inf): they
    // read as 0, which adds inf too (inf - inf would add NaN).  (Narrower data summed in double
    // has an infinite or NaN mean only where it holds an infinity or a NaN: the result is NaN
    // whatever the fill rows add.)
    const A fill = sizeof(T) < sizeof(A) || isfinite(mean) ? mean : (A)0;
    each_step<UNROLL, RS, G, 0, P>(
        p, begin, end, last, D, fill,
        [&](A(&v)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) ss += (v[u] - mean) * (v[u] - mean);
        },
        (const T*)nullptr, 0, first, nlast);
    if (G > 1) ss = lanes_sum<G, DW>(ss);
    if (q != nullptr && r0 == 0) {
        if constexpr (moments_mode<MODE>()) {
            write_moments<O>(q, (double)count, (double)mean, (double)ss);
        } else {
            A var = count > (A)ddof ? ss / (count - (A)ddof) : (A)__longlong_as_double(0x7ff8000000000000ll);
            if (MODE == SOFTMAX_STD) var = sqrt(var);
            *q = finish<O, false>(var, 1);
        }
    }
}

// One worker's segment [begin, end) of row b of the batch (bs: row of the batch * m + segment; d:
// a thread's feature where G = 1): its passes and its results, written only where `write` (a
// worker past the last one writes nothing).  Every lane of the worker calls it (the shuffles need
// them all).  G, DW, P: as softmax_family's.
template <class T, class A, class O, int MODE, int G, int DW, int UNROLL, int P>
__device__ __forceinline__ void family_segment(const T* __restrict__ x, O* __restrict__ out, i64 n, i64 D, i64 b,
                                               i64 bs, i64 d, i64 begin, i64 end, bool write, double ddof) {
    // rows a step of the lanes, rows a loop step (the same with pairs: half the steps of two rows)
    constexpr int RS = softmax_rows_a_step<G, DW, P>(), SR = UNROLL / P * RS;
    if (G > 1) D = DW;  // (the same value, known to the compiler: loads of a step share one address)
    const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
    const int r0 = P * lane / DW;  // the lane's first row in a step
    if (G > 1) d = lane % DW;      // the lane's feature
    const T* p = x + (b * n + r0) * D + d;  // the lane's first row (RS rows a step from it)
    const i64 last = end - r0;               // the segment's end, counted from that row
    const i64 first = begin - r0, nlast = n - r0;  // (pairs: the segment's start, the data's end)
    if constexpr (variance_mode<MODE>()) {
        constexpr int W = moments_mode<MODE>() ? 2 : 1;  // (the moments: two values a (segment, feature))
        variance<T, A, O, MODE, G, DW, UNROLL, P>(p, write ? out + W * (bs * D + d) : nullptr, begin, end, n, D, r0, ddof,
                                                  x + b * n * D, lane);
        return;
    }
    // 1. the maximum (NaN if the segment holds one), and the shift
    A mx = Limits<A>::lowest();
    each_step<UNROLL, RS, G, SOFTMAX_AHEAD, P>(
        p, begin, end, last, D, Limits<A>::lowest(),
        [&](A(&v)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) mx = nan_max(mx, v[u]);
        },
        x + b * n * D, lane, first, nlast);
    if (G > 1) mx = lanes_max<G, DW>(mx);
    const bool finite = mx - mx == (A)0;  // (false for +-inf and NaN)
    const A shift =
        MODE == SOFTMAX_LOGSUMEXP ? (finite ? mx : (A)0) : (mx == Limits<A>::lowest() ? (A)0 : mx);
    // 2. the sum of exp(x - shift) (these reads mostly hit L1/L2: the segment was just read);
    // rows past the end read as -inf add exp(-inf - shift) = 0 where the shift is finite, and
    // where it is not (+inf or NaN), the segment's own rows make the sum NaN whatever they add
    // A lane may read a long segment's rows (a thread per feature alone, a warp's lane 1/32 of
    // them): its steps' sums are added in double (a float sum over 40,000 rows drifted by 1e-4),
    // the lanes' sums in A (32 values: 5 roundings).
    double total = 0;
    each_step<UNROLL, RS, G, 0, P>(
        p, begin, end, last, D, Limits<A>::lowest(),
        [&](A(&v)[UNROLL]) {
            A part = 0;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) part += sum_exp(v[u] - shift);
            total += (double)part;
        },
        (const T*)nullptr, 0, first, nlast);
    const A sum = G > 1 ? lanes_sum<G, DW>((A)total) : (A)total;
    // 3. the results
    if constexpr (MODE == SOFTMAX_LOGSUMEXP) {
        if (write && r0 == 0) out[bs * D + d] = finish<O, false>(log(sum) + shift, 1);
    } else {
        O* q = out + (b * n + r0) * D + d;
        // softmax multiplies exp(x - shift) (exp, not sum_exp: each result keeps exp's
        // accuracy) by 1 / sum (within an ulp of the composition's division; 0/0 and x/0
        // still come out NaN and inf as there: 1 / 0 is inf, 0 * inf NaN).  Whole steps,
        // then single steps, so that no lane computes an exp past the segment's end.
        const A scale = MODE == SOFTMAX_SOFTMAX ? (A)1 / sum : log(sum);
        auto result = [&](A v) { return MODE == SOFTMAX_SOFTMAX ? exp(v - shift) * scale : (v - shift) - scale; };
        if constexpr (P == 2) {
            // Pairs of rows: one store of two results per whole pair; a pair that straddles the
            // segment's bounds (a partial step) writes its rows in the segment one at a time (the
            // result of a row outside it is computed from the fill value and dropped).
            typedef typename Pair<O>::type Q2;
            auto single = [&](i64 i) {  // one masked step of RS rows
                A v[2];
                load_pairs<2, RS, true>(p, i, first, last, nlast, (A)0, v);
                if (i >= first && i < last) q[i] = finish<O, false>(result(v[0]), 1);
                if (i + 1 >= first && i + 1 < last) q[i + 1] = finish<O, false>(result(v[1]), 1);
            };
            i64 i = begin & ~(i64)1;
            if (i < begin) {
                single(i);
                i += RS;
            }
            for (; i + SR <= end; i += SR) {
                A v[UNROLL];
                load_pairs<UNROLL, RS, false>(p, i, first, last, nlast, (A)0, v);
#pragma unroll
                for (int u = 0; u < UNROLL / 2; ++u) {
                    Q2 y;
                    y.a = finish<O, false>(result(v[2 * u]), 1);
                    y.b = finish<O, false>(result(v[2 * u + 1]), 1);
                    *reinterpret_cast<Q2*>(q + i + (i64)u * RS) = y;
                }
            }
            for (; i < end; i += RS) single(i);
            return;
        }
        i64 i = begin;
        for (; i + SR <= end; i += SR) {
            A v[UNROLL];
            load_steps<UNROLL, RS, true>(p, i, last, D, (A)0, v);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) q[(i + (i64)u * RS) * D] = finish<O, false>(result(v[u]), 1);
        }
        for (; i < end; i += RS) {
            if (i < last) q[i * D] = finish<O, false>(result(to_acc<A>(p[i * D])), 1);
        }
    }
}

// Rows past which a worker's segment is left to softmax_long (a block per segment, after the
// workers' kernel).  One segment of 641,841 rows among 4M of 16 read by a warp took 12 times the
// rest of the call (logsumexp of 64M float32 values on an H200).
constexpr i64 SOFTMAX_LONG_ROWS = 1 << 15;
struct LongSegment {
    i64 b, bs, begin, end;  // row of the batch, row of the batch * m + segment, bounds
};
// The list a workers' kernel fills and softmax_long empties: device memory of the host's, room for
// `room` segments (the kernels' argument), zero before the pair of kernels and after it (the last
// block of softmax_long empties it; the host, where the second launch fails or a checked call's
// offsets broke a rule; a checked call whose kernel listed nothing launches no softmax_long).
struct LongList {
    int count;  // segments added (past the room: the warps read the rest)
    int done;   // softmax_long's blocks that have read their segments
    int pad[2];
    LongSegment segment[1];  // (room of them)
};

// A very long segment of a warp's worker added to `longs` (every lane calls it with the same
// values), where the list has room: then true.  Any count added to is noted in bad[1] (checked
// calls: the host reads it once the kernel is done and launches softmax_long, which empties the
// list, only then).  (In line it costs the workers' loop registers, a warp per segment of
// logsumexp 32 -> 39: the host lists with those only in checked calls of fewer than 2^25 values;
// not inlined, the call cost more kernels more registers.)
__device__ __forceinline__ bool list_long(LongList* longs, int room, int* bad, i64 b, i64 bs, i64 begin, i64 end) {
    int slot = 0;
    if ((threadIdx.x & 31) == 0) {
        slot = atomicAdd(&longs->count, 1);
        if (bad != nullptr) bad[1] = 1;
    }
    slot = __shfl_sync(0xffffffffu, slot, 0);
    if (slot >= room) return false;
    if ((threadIdx.x & 31) == 0) longs->segment[slot] = LongSegment{b, bs, begin, end};
    return true;
}

// x: (batch, n, D) C-contiguous; out: like x (softmax, log_softmax) or (batch, m, D) (logsumexp).
// G > 1: a worker is a group of G lanes of a warp (32, or fewer for short segments), DW = D (a
// power of two up to G); G = 1: a worker is a thread and one feature (DW = 1).  workers = batch *
// m (G > 1) or batch * m * D (G = 1).  Every lane of a warp runs the loop over workers the same
// number of times (the shuffles need them all): a worker past the last one takes an empty
// segment and writes nothing.  A group's (or, for one feature, a thread's) segment longer than a
// warp's loop step is read by the whole warp instead, after the groups' own (family_segment with
// G = 32, one such segment at a time): a few lanes would otherwise read it alone, for as long as
// one long segment among short ones takes them.  A segment longer than SOFTMAX_LONG_ROWS is
// added to `longs` (with LIST; room for `room`; not for a thread per feature of several, whose
// layout softmax_long does not take) by the warp that meets it, for softmax_long: the code of
// the list costs the loop registers (a warp per segment of logsumexp, 32 -> 39; 64M float32
// values of mean 256 rows took 20% longer): the host lists in large calls, and in checked calls
// (it waits for them anyway; with those, only below 2^25 values).  bad: checked_bounds's word
// (offsets.cuh) and, after it, list_long's note; or nullptr where the offsets need no check.
// A group reads the bounds of its next segment before it reads the current one's rows, so that
// their round trip to memory overlaps the current segment's (G = 1 reads them when it needs them).
template <class T, class A, class O, int MODE, int G, int DW, int UNROLL, int P, bool LIST, class Off>
__device__ __forceinline__ void softmax_family(const T* __restrict__ x, O* __restrict__ out, Off off, int* bad,
                                               LongList* longs, int room, i64 n, i64 m, i64 D, i64 workers,
                                               double ddof) {
    static_assert(P == 1 || (P == 2 && G == 32 && DW == 1 && sizeof(T) == 2), "pairs of rows: 16-bit data, D = 1");
    static_assert(G == 1 || (G <= 32 && DW <= G && 32 % G == 0), "a worker is a thread or a group of a warp's lanes");
    const i64 stride = (i64)gridDim.x * (blockDim.x / G);
    i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / G;
    // the worker's place in its warp: the warp loops while its first worker has a segment (a warp:
    // while it has one)
    constexpr bool GROUPS = G < 32;
    const int place = GROUPS ? (int)((threadIdx.x & 31) / G) : 0;
    // the rows above which a worker's segment goes to its whole warp (a warp's loop step); never
    // for a thread per feature of several (the warp's layout needs a power of two of them)
    constexpr int WARP_UNROLL = softmax_unroll<T, 32>();
    const i64 longest = G == 1 && D != 1 ? Limits<i64>::highest() : (i64)(WARP_UNROLL * 32 / DW);
    // a segment the warp holds (every lane calls it with the same values), added to the list if it
    // is very long and the list has room: then true
    auto to_list = [&](i64 wb, i64 wbs, i64 wbegin, i64 wend) {
        if constexpr (LIST) {
            return wend - wbegin > SOFTMAX_LONG_ROWS && longs != nullptr &&
                   list_long(longs, room, bad, wb, wbs, wbegin, wend);
        } else {
            return false;
        }
    };
    // the bounds of the worker's next segment (G > 1: worker w's segment is w % m)
    i64 next_begin = 0, next_end = 0;
    if (G > 1 && w < workers) {
        next_begin = off(w % m);
        next_end = off(w % m + 1);
    }
    // (a batch of one row, the common case, needs no 64-bit division per segment: b = 0, s = bs)
    const bool one_row = G > 1 && workers == m;
    for (; w - place < workers; w += stride) {
        const bool valid = !GROUPS || w < workers;  // (a worker past the last one reads nothing)
        const i64 bs = G == 1 ? w / D : w;          // row of the batch * m + segment
        const i64 b = one_row ? 0 : bs / m, s = bs - b * m;
        i64 begin = 0, end = 0;
        if (G > 1) {
            begin = valid ? next_begin : 0;
            end = valid ? next_end : 0;
            if (w + stride < workers) {
                const i64 sn = one_row ? w + stride : (w + stride) % m;
                next_begin = off(sn);
                next_end = off(sn + 1);
            }
        } else if (valid) {
            begin = off(s);
            end = off(s + 1);
        }
        if (valid) checked_bounds(s, m, n, bad, begin, end);
        // (a warp's worker: its segment to the list, where very long)
        const bool listed = !GROUPS && to_list(b, bs, begin, end);
        const bool whole = GROUPS && end - begin > longest;  // (read by the whole warp, below)
        family_segment<T, A, O, MODE, G, DW, UNROLL, P>(x, out, n, D, b, bs, G == 1 ? w % D : 0,
                                                        whole || listed ? 0 : begin, whole || listed ? 0 : end,
                                                        valid && !whole && !listed, ddof);
        if constexpr (GROUPS) {  // the long segments of this warp's workers, by the whole warp (or listed)
            warp_takes_long_segments<G>(whole, b, bs, begin, end, [&](i64 wb, i64 wbs, i64 wbegin, i64 wend) {
                if (!to_list(wb, wbs, wbegin, wend)) {
                    family_segment<T, A, O, MODE, 32, DW, WARP_UNROLL, 1>(x, out, n, D, wb, wbs, 0, wbegin, wend,
                                                                          true, ddof);
                }
            });
        }
    }
}

// softmax_long: the segments a workers' kernel listed, each read by a whole block (family_segment
// with G = THREADS: 8 loads in flight for each of its threads, where a warp had 32 threads'),
// blocks taking the list's segments in turn; the block that ends last empties the list for the
// next call (every block has read the count by then).  DW: the workers' kernel's.
template <class T, class A, class O, int MODE, int DW, int THREADS>
__device__ __forceinline__ void softmax_long(const T* __restrict__ x, O* __restrict__ out, LongList* longs, int room,
                                             i64 n, i64 D, double ddof) {
    const int count = min(longs->count, room);
    for (int e = blockIdx.x; e < count; e += gridDim.x) {
        const LongSegment q = longs->segment[e];
        family_segment<T, A, O, MODE, THREADS, DW, softmax_unroll<T, 32>(), 1>(x, out, n, D, q.b, q.bs, 0, q.begin,
                                                                               q.end, true, ddof);
    }
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(&longs->done, 1) == (int)gridDim.x - 1) {
        longs->count = 0;
        longs->done = 0;
    }
}

// ---- entry points -------------------------------------------------------------------
// linred_softmax: softmax_family; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}; ddof: the
// bits of a double (var and std; the other modes ignore it); LIST: whether to list very long segments
// in longs, softmax_long's list (else null).
#define LINRED_SOFTMAX(T, A, O, MODE, G, DW, P, LIST, THREADS, I, OFFSETS)                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_softmax(const T* x, O* out, const I* offsets, int* bad, LongList* longs, long long room,         \
                       long long L, long long n, long long m, long long d, long long workers, long long ddof) { \
        static_assert(THREADS % 32 == 0, "a worker of G = 32 lanes is a whole warp of the block");            \
        softmax_family<T, A, O, MODE, G, DW, softmax_unroll<T, G>(), P, LIST>(x, out, OFFSETS, bad, longs,       \
                                                                              (int)room, n, m, d, workers,      \
                                                                              __longlong_as_double(ddof));      \
    }
// linred_softmax_long: softmax_long, after linred_softmax of the same call (its DW).
#define LINRED_SOFTMAX_LONG(T, A, O, MODE, DW, THREADS)                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_softmax_long(const T* x, O* out, LongList* longs, long long room, long long n, long long d,      \
                            long long ddof) {                                                                  \
        softmax_long<T, A, O, MODE, DW, THREADS>(x, out, longs, (int)room, n, d, __longlong_as_double(ddof));  \
    }
