// logsumexp as a reduction: the accumulator and operation warp_reduce and tile_fixup take to
// compute a segmented logsumexp of one feature column in one read of the data.
//
// Holds:
//  - LseAcc<F>: a piece of a segment as (m, s), its maximum and the sum of exp(x - m) over its
//    values, so that its logsumexp is m + log(s) (where m is not finite, s is only kept from
//    being 0 or NaN where it must not be: see OpLse::registers); nothing is (-inf, 0);
//  - OpLse: its identity and combine, which rescales the sum of the piece with the smaller
//    maximum (one exp per combine: exp(-|m1 - m2|)), and its passes over values in registers
//    (OwnsRegisters): registers and marked (a thread's values, the maxima then the exps; lse_term
//    is a value's exp beside its piece's maximum) and warp_all (the lanes' pieces);
//  - the overloads of shfl_xor, shfl_up, shfl_idx (common.cuh) and load (fixup.cuh) that move an
//    LseAcc as its two words;
//  - softmax_from_parts: softmax and log_softmax of a call whose segments' parts warp_reduce
//    computed (a second read of the data, walked by offsets.cuh's segment_chunks with the body
//    SoftmaxFromParts; SoftmaxPart, a segment's shift and scale): its entry point
//    LINRED_SOFTMAX_FROM_PARTS (linred_softmax_from_parts).
//
// warp_reduce (warp.cuh) reads any segments of aligned contiguous rows alike: every lane reads its
// own consecutive values and the pieces that cross lanes, warps and runs are joined by the
// segmented scan and the fix-up, so a long segment is read by as many warps as its tiles
// (softmax.cuh gives each segment a worker of 1 to 32 lanes, which reads a long one alone).  Its
// bookkeeping per value is that of its sums, and the pieces' maxima and exps come on top (2.4
// times the sums' instructions at segments of 16 values, ncu on an H200): the workers' kernel
// stays faster where segments are short and even (linred/_softmax_kernel.py, LSE_RUNS_MIN_MEAN).
// Include this header before warp.cuh and fixup.cuh: the overloads must be declared before the
// templates that call them.
//
// The results are those of softmax.cuh's logsumexp (the composition's formula, the shift being
// the segment's maximum, or 0 where that is not finite) for every value: a segment holding NaN
// gives NaN (a NaN value makes s NaN, and every combine keeps it), one holding +inf (and no NaN)
// gives +inf, an all -inf or empty one gives -inf (-inf + log(s), s = 0 for an empty one), and
// the others m + log(s) with m their maximum, as the composition's log(sum) + shift.  The exps
// are sum_exp's: the terms of a sum whose largest is 1.  The pieces are joined in a fixed order
// (the lanes' scan, the runs' fix-up): the same bits every run.

#pragma once

#include "offsets.cuh"

enum { SOFTMAX_FROM_PARTS_SOFTMAX = 1, SOFTMAX_FROM_PARTS_LOG_SOFTMAX = 2 };

template <class F> struct LseAcc {
    typedef F type;
    F m;  // the piece's maximum (-inf: no value; NaN: a NaN value)
    F s;  // the sum of exp(x - m) over its values (NaN where one is NaN)
    LseAcc() = default;
    __device__ __forceinline__ LseAcc(F max, F sum) : m(max), s(sum) {}
    // One value (to_acc: (A)promote(v)).
    __device__ __forceinline__ LseAcc(F x) : m(x), s(F(1)) {}
    // The piece's logsumexp (finish, Store: (O)acc); explicit, so that no arithmetic takes an
    // LseAcc for a number.
    __device__ __forceinline__ explicit operator float() const { return (float)(m + log(s)); }
    __device__ __forceinline__ explicit operator double() const { return (double)(m + log(s)); }
};

struct OpLse {
    template <class T, class A> static __device__ __forceinline__ A identity() {
        typedef typename A::type F;
        return A(Limits<F>::lowest(), F(0));
    }
    // The piece of the larger maximum keeps it; the other's sum is scaled by exp(-|m1 - m2|).
    // Equal maxima (infinite ones too, whose difference would be NaN) add their sums; a NaN
    // maximum makes the difference NaN, so the scale and the sum are NaN.  An empty piece
    // (-inf, 0) adds 0 * exp(-inf) = 0, or its 0 to an all -inf one's sum.
    template <class A> static __device__ __forceinline__ A combine(A a, A b) {
        typedef typename A::type F;
        const F d = a.m == b.m ? F(0) : a.m - b.m;
        const F e = sum_exp(-fabs(d));
        const bool first = d > F(0);
        return A(first ? a.m : b.m, first ? fma(b.s, e, a.s) : fma(a.s, e, b.s));
    }
    template <class A, int N, class V> static __device__ __forceinline__ A registers(const V (&vbuf)[N]);
    template <class A, int ITEMS, int VEC, int PAD, class V, int N>
    static __device__ __forceinline__ A marked(const V (&vbuf)[N], unsigned mask, A* mine);
    template <class A> static __device__ __forceinline__ A warp_all(A v);
};

// A thread's values in registers (combine_registers, marked_pieces: OwnsRegisters), as pieces of
// one pass over the maxima and one over the exps, whose exps are independent of each other (a
// combine per value would chain them, each waiting for the previous one's exp); and the lanes'
// pieces (warp_all) as the maximum of their maxima, then the sum of their sums rescaled to it.
template <> struct OwnsRegisters<OpLse> { enum { value = 1 }; };

// exp(x - m) for a value x of a piece of maximum m: exactly 1 where x is m (infinite maxima too:
// no inf - inf), NaN where m is.
template <class F> __device__ __forceinline__ F lse_term(F x, F m) { return x == m ? F(1) : sum_exp(x - m); }

// The piece of all of a thread's N vectors of values: its maximum m, and the sum of exp(x - shift)
// with the shift m where that is finite, else 0 (the composition's shift).  So an all -inf piece
// is (-inf, 0), one holding +inf (+inf, +inf) and one holding NaN (NaN, NaN).  (marked gives
// (-inf, count) and (+inf, count of +inf) instead: lse_term adds 1 for a value equal to the
// maximum.)  Beside an infinite maximum a sum only has to stay positive, and NaN where a value is
// NaN: m + log(s) is then the same +inf or -inf (-inf + log(0) too), and combine and warp_all keep
// a piece of the larger maximum's sum, scale the other's by 0, or add two of an equal one.
template <class A, int N, class V> __device__ __forceinline__ A OpLse::registers(const V (&vbuf)[N]) {
    typedef typename A::type F;
    constexpr int VEC = (int)(sizeof(vbuf[0].v) / sizeof(vbuf[0].v[0]));
    F m = (F)promote(vbuf[0].v[0]);
#pragma unroll
    for (int i = 1; i < N * VEC; ++i) m = nan_max(m, (F)promote(vbuf[i / VEC].v[i % VEC]));
    const F shift = m - m == F(0) ? m : F(0);  // (inf - inf and NaN - NaN are NaN)
    F s[4] = {F(0), F(0), F(0), F(0)};  // (four chains of adds)
#pragma unroll
    for (int i = 0; i < N * VEC; ++i) s[i % 4] += sum_exp((F)promote(vbuf[i / VEC].v[i % VEC]) - shift);
    return A(m, (s[0] + s[1]) + (s[2] + s[3]));
}

// marked_pieces: the thread's ITEMS values cut at the marks of mask (bit i: a segment starts at
// value i); the piece ending before each mark i is stored at mine[i + (i / 16) * PAD] (the empty
// piece at a mark on the first value), the piece open at the end returned.
template <class A, int ITEMS, int VEC, int PAD, class V, int N>
__device__ __forceinline__ A OpLse::marked(const V (&vbuf)[N], unsigned mask, A* mine) {
    typedef typename A::type F;
    F top[ITEMS];  // each value's piece's maximum: a running maximum, then spread back
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const F x = (F)promote(vbuf[i / VEC].v[i % VEC]);
        top[i] = i == 0 || ((mask >> i) & 1u) ? x : nan_max(top[i - 1], x);
    }
#pragma unroll
    for (int i = ITEMS - 2; i >= 0; --i)
        if (!((mask >> (i + 1)) & 1u)) top[i] = top[i + 1];
    F s = F(0);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        if ((mask >> i) & 1u) {
            mine[i + (i >> 4) * PAD] = i == 0 ? identity<F, A>() : A(top[i - 1], s);
            s = F(0);
        }
        s += lse_term((F)promote(vbuf[i / VEC].v[i % VEC]), top[i]);
    }
    return A(top[ITEMS - 1], s);
}

// The lanes' pieces joined, in every lane: the maximum M of their maxima, then the sum of their
// sums times exp(m - M) (1 where m is M; NaN where M is; 0 beside a larger one).  Shuffles of one
// word each, and one exp: a butterfly of combines would take five.  Every lane adds the same
// values in the same tree: the same bits in every lane and every run.
template <class A> __device__ __forceinline__ A OpLse::warp_all(A v) {
    typedef typename A::type F;
    F top = v.m;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) top = nan_max(top, __shfl_xor_sync(0xffffffffu, top, o));
    F s = v.s * lse_term(v.m, top);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    return A(top, s);
}

template <class F> __device__ __forceinline__ LseAcc<F> shfl_xor(LseAcc<F> v, int mask) {
    return LseAcc<F>(__shfl_xor_sync(0xffffffffu, v.m, mask), __shfl_xor_sync(0xffffffffu, v.s, mask));
}
template <class F> __device__ __forceinline__ LseAcc<F> shfl_up(LseAcc<F> v, int d) {
    return LseAcc<F>(__shfl_up_sync(0xffffffffu, v.m, d), __shfl_up_sync(0xffffffffu, v.s, d));
}
template <class F> __device__ __forceinline__ LseAcc<F> shfl_idx(LseAcc<F> v, int src) {
    return LseAcc<F>(__shfl_sync(0xffffffffu, v.m, src), __shfl_sync(0xffffffffu, v.s, src));
}
// A partial written by other blocks of the same launch (COHERENT), read past the non-coherent
// caches a word at a time (fixup.cuh's load, for an LseAcc).
template <bool COHERENT, class F> __device__ __forceinline__ LseAcc<F> load(const LseAcc<F>* p) {
    if constexpr (COHERENT) {
        const volatile F* w = reinterpret_cast<const volatile F*>(p);
        return LseAcc<F>(w[0], w[1]);
    } else {
        return *p;
    }
}

// ---- softmax and log_softmax from a segment's parts ---------------------------------------
// softmax_from_parts: softmax (MODE 1) or log_softmax (MODE 2) of x, `rows` rows of n values of
// one feature, whose segments' parts (m, s) warp_reduce wrote with OpLse (parts[row * segments +
// segment], the maximum and the sum of exp(x - maximum)): exp(x - m) / s, or (x - m) - log(s), by
// the formulas of softmax.cuh (the shift the segment's maximum, exp, not sum_exp, for each
// result); NaN in every value of a segment whose maximum is not finite (+inf, NaN, all -inf), as
// there.  The values are walked by offsets.cuh's segment_chunks: a chunk inside one segment reads
// no offsets.  (With offsets that break the rules, check=True, the host raises after the call.)
struct SoftmaxPart {
    float top;    // the segment's maximum
    float scale;  // 1 / s (softmax) or log(s) (log_softmax)
    bool finite;  // whether top is finite
};
template <class T, class O, int MODE> struct SoftmaxFromParts {  // (segment_chunks' Body)
    typedef SoftmaxPart P;
    typedef float V;
    const T* __restrict__ x;
    O* __restrict__ y;
    const LseAcc<float>* __restrict__ parts;
    i64 n, segments;
    __device__ __forceinline__ P part(i64 r, i64 s) const {
        const LseAcc<float> p = parts[r * segments + s];
        P q;
        q.top = p.m;
        q.finite = p.m - p.m == 0.0f;
        q.scale = MODE == SOFTMAX_FROM_PARTS_SOFTMAX ? 1.0f / p.s : log(p.s);
        return q;
    }
    __device__ __forceinline__ V load(i64 r, i64 i) const { return (float)promote(x[r * n + i]); }
    __device__ __forceinline__ void write(i64 r, i64 i, const P& q, V v) const {
        const float result = MODE == SOFTMAX_FROM_PARTS_SOFTMAX ? exp(v - q.top) * q.scale : (v - q.top) - q.scale;
        y[r * n + i] = Store<O>::from(q.finite ? result : __int_as_float(0x7fc00000));
    }
};
template <class T, class O, int MODE, int THREADS, int ITEMS, class Off>
__device__ __forceinline__ void softmax_from_parts(const T* __restrict__ x, O* __restrict__ y,
                                                   const LseAcc<float>* __restrict__ parts, Off off, i64 rows,
                                                   i64 n, i64 segments) {
    segment_chunks<THREADS, ITEMS>(off, rows, n, segments, SoftmaxFromParts<T, O, MODE>{x, y, parts, n, segments});
}

// linred_softmax_from_parts: softmax_from_parts; OFFSETS is FixedOffsets{L} or
// ArrayOffsets<I>{offsets}.
#define LINRED_SOFTMAX_FROM_PARTS(T, O, MODE, THREADS, ITEMS, I, OFFSETS)                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) linred_softmax_from_parts(                           \
        const T* x, O* y, const LseAcc<float>* parts, const I* offsets, long long L, long long rows, long long n,   \
        long long m) {                                                                                             \
        softmax_from_parts<T, O, MODE, THREADS, ITEMS>(x, y, parts, OFFSETS, rows, n, m);                         \
    }
