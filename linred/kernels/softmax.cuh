// softmax_family: segmented logsumexp, softmax and log_softmax in one kernel.
//
// Holds:
//  - softmax_family: each (row of the batch, segment, feature) is one worker of G lanes
//    (G = 32, a warp, for one feature column; G = 1, a thread, for feature rows, whose
//    neighbouring threads read neighbouring features of a row); a worker reads its segment
//    for the maximum, again for the sum of exp(x - shift), and (softmax, log_softmax) a third
//    time to write each element, the later reads mostly from L1/L2;
//  - its entry point: LINRED_SOFTMAX (linred_softmax).
//
// The results are those of linred's composition (linred/_fused.py), value for value:
//  - the shift is the segment's maximum, or 0 where that is not finite (logsumexp) or is -inf
//    (softmax, log_softmax), so that NaN, +inf and all -inf segments give what
//    torch.logsumexp / torch.softmax give (NaN; +inf for logsumexp, NaN for softmax; -inf for
//    logsumexp, NaN for softmax);
//  - sums in A (float32 for 16-bit and float32 data, float64 for float64), lanes' partials
//    added by a fixed shuffle tree: the same bits every run.

#pragma once

#include "offsets.cuh"

enum { SOFTMAX_LOGSUMEXP = 0, SOFTMAX_SOFTMAX = 1, SOFTMAX_LOG_SOFTMAX = 2 };

template <int G, class A> __device__ __forceinline__ A group_max(A v) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) v = OpMax::combine(v, shfl_xor(v, o));
    return v;
}
template <int G, class A> __device__ __forceinline__ A group_sum(A v) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) v += shfl_xor(v, o);
    return v;
}

// x: (batch, n, D) C-contiguous; out: like x (softmax, log_softmax) or (batch, m, D) (logsumexp).
// workers = batch * m * D; every lane of a worker runs the same loops (the shuffles need them all).
// bad: checked_bounds's word (offsets.cuh), or nullptr where the offsets need no check.
template <class T, class A, class O, int MODE, int G, class Off>
__device__ __forceinline__ void softmax_family(const T* __restrict__ x, O* __restrict__ out, Off off, int* bad, i64 n,
                                               i64 m, i64 D, i64 workers) {
    const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
    const i64 stride = (i64)gridDim.x * (blockDim.x / G);
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / G; w < workers; w += stride) {
        const i64 d = w % D, bs = w / D;  // bs: row of the batch * m + segment
        const i64 b = bs / m, s = bs - b * m;
        i64 begin = off(s), end = off(s + 1);
        checked_bounds(s, m, n, bad, begin, end);
        const T* p = x + b * n * D + d;
        A mx = Limits<A>::lowest();
        for (i64 i = begin + lane; i < end; i += G) mx = OpMax::combine(mx, to_acc<A>(p[i * D]));
        mx = group_max<G>(mx);
        const bool finite = mx - mx == (A)0;  // (false for +-inf and NaN)
        const A shift =
            MODE == SOFTMAX_LOGSUMEXP ? (finite ? mx : (A)0) : (mx == Limits<A>::lowest() ? (A)0 : mx);
        A sum = 0;
        for (i64 i = begin + lane; i < end; i += G) sum += exp(to_acc<A>(p[i * D]) - shift);
        sum = group_sum<G>(sum);
        if constexpr (MODE == SOFTMAX_LOGSUMEXP) {
            if (lane == 0) out[bs * D + d] = finish<O, false>(log(sum) + shift, 1);
        } else {
            O* q = out + b * n * D + d;
            if constexpr (MODE == SOFTMAX_SOFTMAX) {
                for (i64 i = begin + lane; i < end; i += G) {
                    q[i * D] = finish<O, false>(exp(to_acc<A>(p[i * D]) - shift) / sum, 1);
                }
            } else {
                const A ls = log(sum);
                for (i64 i = begin + lane; i < end; i += G) {
                    q[i * D] = finish<O, false>((to_acc<A>(p[i * D]) - shift) - ls, 1);
                }
            }
        }
    }
}

// ---- entry point --------------------------------------------------------------------
// linred_softmax: softmax_family; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
#define LINRED_SOFTMAX(T, A, O, MODE, G, THREADS, I, OFFSETS)                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_softmax(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,  \
                       long long d, long long workers) {                                                       \
        softmax_family<T, A, O, MODE, G>(x, out, OFFSETS, bad, n, m, d, workers);                              \
    }
