// softmax_family: segmented logsumexp, softmax and log_softmax in one kernel.
//
// Holds:
//  - Running: a running maximum and sum of exp(x - maximum) (the "online" softmax), updated
//    a few values at a time and merged across lanes;
//  - softmax_family: each (row of the batch, segment) is one worker: a warp (G = 32) where the
//    features D are a power of two up to 32 (the lanes cover 32 / D rows of D features: every
//    load is 32 consecutive elements), else one thread per (row of the batch, segment,
//    feature) (G = 1: neighbouring threads read neighbouring features of a row).  A worker
//    reads its segment once for the maximum and the sum together and, for softmax and
//    log_softmax, once more to write each element (that read mostly from L1/L2);
//  - its entry point: LINRED_SOFTMAX (linred_softmax).
//
// The results are those of linred's composition (linred/_fused.py): a segment holding NaN
// gives NaN; one whose maximum is +inf gives +inf (logsumexp) or NaN (softmax, log_softmax);
// an all -inf or empty segment gives -inf (logsumexp) or NaN; otherwise
// logsumexp = max + log(sum), softmax = exp(x - max) / sum, log_softmax = (x - max) - log(sum),
// with sum = the sum of exp(x - max).  Sums in A (float32 for 16-bit and float32 data, float64
// for float64); lanes are merged by a fixed shuffle tree: the same bits every run.

#pragma once

#include "offsets.cuh"

enum { SOFTMAX_LOGSUMEXP = 0, SOFTMAX_SOFTMAX = 1, SOFTMAX_LOG_SOFTMAX = 2 };

template <class A> struct Running {
    A mx;      // the largest value that is not NaN (-inf: none yet)
    A sum;     // the sum of exp(v - mx) over the values so far (meaningless where mx is +-inf)
    bool nan;  // a NaN was seen

    __device__ __forceinline__ Running() : mx(Limits<A>::lowest()), sum(0), nan(false) {}

    // K values at once: their maximum first (comparisons only), the sum rescaled once if it grew,
    // then one exp per value.  (A rescale per value that raises the maximum, the lanes of a warp
    // each on its own branch, cost two exps per value: 64M float32 values took 40% longer.)
    template <int K> __device__ __forceinline__ void add(const A (&v)[K]) {
        A cm = Limits<A>::lowest();
#pragma unroll
        for (int u = 0; u < K; ++u) {
            cm = v[u] > cm ? v[u] : cm;  // (NaN is never larger)
            nan |= v[u] != v[u];
        }
        if (cm > mx) {
            // exp(-inf - cm) = 0 on the first values; a maximum of +inf fixes the result (sum unused)
            sum = mx == Limits<A>::lowest() || cm == Limits<A>::highest() ? (A)0 : sum * exp(mx - cm);
            mx = cm;
        }
        if (mx != Limits<A>::lowest() && mx != Limits<A>::highest()) {  // (else exp(-inf - -inf) is NaN)
#pragma unroll
            for (int u = 0; u < K; ++u) sum += exp(v[u] - mx);  // (-inf adds 0; NaN makes it NaN: unused)
        }
    }

    // Merged with another lane's: the same as if this lane had seen that lane's values too
    // (up to rounding).
    __device__ __forceinline__ void merge(A omx, A osum, bool onan) {
        nan |= onan;
        const A m = omx > mx ? omx : mx;
        if (m == Limits<A>::lowest() || m == Limits<A>::highest()) {
            sum = 0;  // (not used: the result is fixed by the maximum)
        } else {
            sum = sum * exp(mx - m) + osum * exp(omx - m);
        }
        mx = m;
    }

    // 0: a finite maximum (the results follow from mx and sum), 1: NaN or a maximum of +inf,
    // 2: all -inf or empty.
    __device__ __forceinline__ int special() const {
        return nan || mx == Limits<A>::highest() ? 1 : mx == Limits<A>::lowest() ? 2 : 0;
    }
};

// Merges the running values of the lanes that share a feature (lanes lane ^ o for o >= DW).
template <int DW, class A> __device__ __forceinline__ void merge_lanes(Running<A>& r) {
#pragma unroll
    for (int o = 16; o >= DW; o /= 2) {
        const A omx = shfl_xor(r.mx, o), osum = shfl_xor(r.sum, o);
        const bool onan = __shfl_xor_sync(0xffffffffu, (int)r.nan, o) != 0;
        r.merge(omx, osum, onan);
    }
}

// x: (batch, n, D) C-contiguous; out: like x (softmax, log_softmax) or (batch, m, D) (logsumexp).
// G = 32: a worker is a warp, DW = D (a power of two up to 32); G = 1: a worker is a thread and
// one feature (DW = 1).  workers = batch * m (G = 32) or batch * m * D (G = 1).  Every lane of a
// worker runs the same loops (the shuffles need them all).  bad: checked_bounds's word
// (offsets.cuh), or nullptr where the offsets need no check.
template <class T, class A, class O, int MODE, int G, int DW, int UNROLL, class Off>
__device__ __forceinline__ void softmax_family(const T* __restrict__ x, O* __restrict__ out, Off off, int* bad, i64 n,
                                               i64 m, i64 D, i64 workers) {
    constexpr int RS = G / DW;  // rows a worker's lanes cover per step
    const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
    const int r0 = lane / DW;                      // the lane's first row in a step
    const i64 stride = (i64)gridDim.x * (blockDim.x / G);
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / G; w < workers; w += stride) {
        i64 d, bs;  // the lane's feature; row of the batch * m + segment
        if (G == 1) {
            d = w % D;
            bs = w / D;
        } else {
            d = lane % DW;
            bs = w;
        }
        const i64 b = bs / m, s = bs - b * m;
        i64 begin = off(s), end = off(s + 1);
        checked_bounds(s, m, n, bad, begin, end);
        const T* p = x + b * n * D + d;
        Running<A> r;
        i64 i = begin + r0;
        for (; i + (UNROLL - 1) * RS < end; i += UNROLL * RS) {
            A v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = to_acc<A>(p[(i + u * RS) * D]);
            r.add(v);
        }
        for (; i < end; i += RS) {
            const A v[1] = {to_acc<A>(p[i * D])};
            r.add(v);
        }
        if (G > 1) merge_lanes<DW>(r);
        const int special = r.special();
        if constexpr (MODE == SOFTMAX_LOGSUMEXP) {
            if (r0 == 0) {
                const A nan = Limits<A>::highest() - Limits<A>::highest();
                const A v = special == 0 ? r.mx + log(r.sum) : special == 2 ? Limits<A>::lowest()
                                                             : (r.nan ? nan : Limits<A>::highest());
                out[bs * D + d] = finish<O, false>(v, 1);
            }
        } else {
            O* q = out + b * n * D + d;
            // softmax multiplies by 1 / sum (within an ulp of the composition's division)
            const A scale = MODE == SOFTMAX_SOFTMAX ? (A)1 / r.sum : log(r.sum);
            const A nan = Limits<A>::highest() - Limits<A>::highest();
            for (i = begin + r0; i < end; i += RS) {
                const A v = to_acc<A>(p[i * D]);
                A y;
                if (special != 0) {
                    y = nan;
                } else if (MODE == SOFTMAX_SOFTMAX) {
                    y = exp(v - r.mx) * scale;
                } else {
                    y = (v - r.mx) - scale;
                }
                q[i * D] = finish<O, false>(y, 1);
            }
        }
    }
}

// ---- entry point --------------------------------------------------------------------
// linred_softmax: softmax_family; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
#define LINRED_SOFTMAX(T, A, O, MODE, G, DW, THREADS, I, OFFSETS)                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_softmax(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,  \
                       long long d, long long workers) {                                                       \
        softmax_family<T, A, O, MODE, G, DW, 4>(x, out, OFFSETS, bad, n, m, d, workers);                       \
    }
