// linred's CUDA C++: what every kernel family shares.  Compiled at run time with NVRTC,
// self-contained (no CUDA headers: half and bfloat16 conversions use PTX).
//
// Holds:
//  - types: i64, u64, half_t and bf16_t (16-bit floats as their bits);
//  - conversions: h2f and b2f (16-bit floats to float, exactly), Promote, promote, to_acc
//    (a value into its accumulator), Store (an accumulator into the result type, 16-bit
//    floats rounded to nearest even by the hardware's cvt.rn);
//  - Limits, and the operations OpSum, OpProd, OpMax and OpMin (NaN-propagating), with the
//    identity of the result dtype;
//  - finish: a segment's result (a mean divides by the length, NaN when empty);
//  - shfl_xor, shfl_up, shfl_idx (an accumulator's shuffles: lse.cuh overloads them), VecOf
//    (16-byte vectors); nan_max (a NaN-propagating max in one instruction) and sum_exp (exp of a
//    term of a sum of exps: softmax.cuh, lse.cuh); warp_takes_long_segments (a warp's workers
//    of fewer lanes hand it their long segments: softmax.cuh, softmax_grad.cuh);
//  - building blocks of several families: warp_all (the lanes' combination) and block_combine
//    (a fixed tree over a block), combine_registers and marked_pieces (a thread's elements in
//    registers; OwnsRegisters: an operation that does these itself), and warp_flag_scan (a
//    segmented scan over the lanes).
//
// The nvrtc backend's kernel families, each in a header of its own that includes this one:
//  - fixed.cuh: fixed_small, fixed_rows, fixed_long (power-of-two and long fixed lengths);
//  - tile.cuh: tile_reduce and tile_bounds (any segments, any strides);
//  - warp.cuh: warp_reduce (any segments of aligned contiguous rows);
//  - fixup.cuh: tile_fixup (segments that span the runs of tile_reduce or warp_reduce);
//  - features.cuh: features_reduce (segments of rows of feature columns);
//  - offsets.cuh: segment boundaries and the tiling of rows those families share;
//  - softmax.cuh and softmax_grad.cuh: the softmax family, var and std, and their gradients;
//  - lse.cuh: logsumexp as warp_reduce's operation (OpLse), and softmax_from_parts.
// checks.cuh holds the check of offsets that check=True runs on the device (any backend).
// scan.cuh turns device lengths into offsets in one launch (any backend).
// ids.cuh turns device segment ids into offsets in one launch, testing their rules (any backend).
// gather.cuh copies rows of a device array in a given order (unsorted segment ids' data).
// Each family header also defines the macros that instantiate its kernels as
// extern "C" entry points (plain names, so that a compiled binary can be cached);
// linred/backends/nvrtc/kernels.py writes one such line per kernel it compiles, and
// linred/kernels/compiler.py expands the #include lines of the result.  (operators.cuh,
// bf16.cuh and elementwise.cuh serve the cub backend and the CuPy kernels instead.)

#pragma once

typedef long long i64;
typedef unsigned long long u64;

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

// ---- conversions -------------------------------------------------------------
template <class T> struct Promote { typedef T type; };
template <> struct Promote<half_t> { typedef float type; };
template <> struct Promote<bf16_t> { typedef float type; };
template <> struct Promote<bool> { typedef int type; };
template <> struct Promote<signed char> { typedef int type; };
template <> struct Promote<unsigned char> { typedef unsigned int type; };
template <> struct Promote<short> { typedef int type; };
template <> struct Promote<unsigned short> { typedef unsigned int type; };

__device__ __forceinline__ float h2f(half_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float b2f(bf16_t v) { return __uint_as_float(((unsigned)v.bits) << 16); }

template <class T> __device__ __forceinline__ typename Promote<T>::type promote(T v) {
    return (typename Promote<T>::type)v;
}
template <> __device__ __forceinline__ float promote<half_t>(half_t v) { return h2f(v); }
template <> __device__ __forceinline__ float promote<bf16_t>(bf16_t v) { return b2f(v); }

template <class A, class T> __device__ __forceinline__ A to_acc(T v) { return (A)promote(v); }

template <class O> struct Store {
    template <class A> static __device__ __forceinline__ O from(A v) { return (O)v; }
};
template <> struct Store<half_t> {
    template <class A> static __device__ __forceinline__ half_t from(A v) {
        half_t h;
        float f = (float)v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
        return h;
    }
};
template <> struct Store<bf16_t> {
    template <class A> static __device__ __forceinline__ bf16_t from(A v) {
        bf16_t h;
        float f = (float)v;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
        return h;
    }
};

// ---- limits and operations ---------------------------------------------------
template <class T> struct Limits;
template <> struct Limits<float> {
    static __device__ __forceinline__ float lowest() { return __int_as_float(0xff800000); }
    static __device__ __forceinline__ float highest() { return __int_as_float(0x7f800000); }
};
template <> struct Limits<double> {
    static __device__ __forceinline__ double lowest() { return __longlong_as_double(0xfff0000000000000ull); }
    static __device__ __forceinline__ double highest() { return __longlong_as_double(0x7ff0000000000000ull); }
};
template <> struct Limits<half_t> : Limits<float> {};
template <> struct Limits<bf16_t> : Limits<float> {};
template <> struct Limits<bool> {
    static __device__ __forceinline__ int lowest() { return 0; }
    static __device__ __forceinline__ int highest() { return 1; }
};
template <> struct Limits<signed char> {
    static __device__ __forceinline__ int lowest() { return -128; }
    static __device__ __forceinline__ int highest() { return 127; }
};
template <> struct Limits<unsigned char> {
    static __device__ __forceinline__ unsigned lowest() { return 0u; }
    static __device__ __forceinline__ unsigned highest() { return 255u; }
};
template <> struct Limits<short> {
    static __device__ __forceinline__ int lowest() { return -32768; }
    static __device__ __forceinline__ int highest() { return 32767; }
};
template <> struct Limits<unsigned short> {
    static __device__ __forceinline__ unsigned lowest() { return 0u; }
    static __device__ __forceinline__ unsigned highest() { return 65535u; }
};
template <> struct Limits<int> {
    static __device__ __forceinline__ int lowest() { return (int)0x80000000; }
    static __device__ __forceinline__ int highest() { return 0x7fffffff; }
};
template <> struct Limits<unsigned int> {
    static __device__ __forceinline__ unsigned lowest() { return 0u; }
    static __device__ __forceinline__ unsigned highest() { return 0xffffffffu; }
};
template <> struct Limits<i64> {
    static __device__ __forceinline__ i64 lowest() { return (i64)0x8000000000000000ull; }
    static __device__ __forceinline__ i64 highest() { return 0x7fffffffffffffffll; }
};
template <> struct Limits<u64> {
    static __device__ __forceinline__ u64 lowest() { return 0ull; }
    static __device__ __forceinline__ u64 highest() { return 0xffffffffffffffffull; }
};

// The identity is that of the RESULT dtype (the kernels pass O: an empty int8 max
// is -128, or the int64 minimum with dtype=int64), held in the accumulator type A.
struct OpSum {
    template <class T, class A> static __device__ __forceinline__ A identity() { return A(0); }
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return a + b; }
};
// Integers wrap around (two's complement, as NumPy's products do): signed ones multiply as
// unsigned, where wrapping is defined (a signed overflow is undefined in C++); floats follow IEEE.
template <class A> struct ProdOf { static __device__ __forceinline__ A mul(A a, A b) { return a * b; } };
template <> struct ProdOf<int> {
    static __device__ __forceinline__ int mul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
};
template <> struct ProdOf<i64> {
    static __device__ __forceinline__ i64 mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
};
struct OpProd {
    template <class T, class A> static __device__ __forceinline__ A identity() { return A(1); }
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return ProdOf<A>::mul(a, b); }
};
// NaN-propagating: a NaN operand wins (x != x only for NaN).
struct OpMax {
    template <class T, class A> static __device__ __forceinline__ A identity() { return (A)Limits<T>::lowest(); }
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return (a > b || a != a) ? a : b; }
};
struct OpMin {
    template <class T, class A> static __device__ __forceinline__ A identity() { return (A)Limits<T>::highest(); }
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return (a < b || a != a) ? a : b; }
};

// ---- finishing a segment: mean divides by the length (NaN when empty) ---------
template <class A> struct MeanOf { typedef A type; };
template <> struct MeanOf<i64> { typedef double type; };
template <> struct MeanOf<u64> { typedef double type; };

template <class O, bool MEAN, class A> __device__ __forceinline__ O finish(A acc, i64 len) {
    if constexpr (MEAN) {
        typedef typename MeanOf<A>::type F;
        F r = len > 0 ? (F)acc / (F)len : (F)__longlong_as_double(0x7ff8000000000000ull);
        return Store<O>::from(r);
    } else {
        return Store<O>::from(acc);
    }
}

// Shuffles of an accumulator: 32- or 64-bit words (narrow accumulators never occur: Promote), or a
// struct of them with overloads of its own (lse.cuh).
template <class A> __device__ __forceinline__ A shfl_xor(A v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
template <class A> __device__ __forceinline__ A shfl_up(A v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
template <class A> __device__ __forceinline__ A shfl_idx(A v, int src) { return __shfl_sync(0xffffffffu, v, src); }

// The larger of a and b, NaN if either is (OpMax::combine in one instruction where the GPU has it).
template <class A> __device__ __forceinline__ A nan_max(A a, A b) { return OpMax::combine(a, b); }
#if __CUDA_ARCH__ >= 800
template <> __device__ __forceinline__ float nan_max(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
#endif

// exp(t) for a term of a sum of exps whose largest term is 1 (t = x - the segment's maximum;
// softmax.cuh, lse.cuh):
// float: 2^(t log2 e) by ex2.approx.ftz (2 instructions in place of about 8 for expf; within
// 2 + 1.2 |t| ulp of exp(t) (the error of __expf), so a term's error is at most about 0.5 ulp of
// the largest term, and a term below 2^-126 counts as 0, far below an ulp of the sum);
// double: exp.
__device__ __forceinline__ float sum_exp(float t) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t * 1.4426950408889634f));
    return r;
}
__device__ __forceinline__ double sum_exp(double t) { return exp(t); }

// Workers of G lanes that share a warp (G < 32) and hand their long segments to it: for each
// worker whose `whole` is set (by its first lane, lane % G == 0), one at a time, every lane of the
// warp calls f(b, bs, begin, end) with that worker's values (row of the batch, row of the batch *
// m + segment, bounds).  Every lane of the warp calls it.
template <int G, class F>
__device__ __forceinline__ void warp_takes_long_segments(bool whole, i64 b, i64 bs, i64 begin, i64 end, F f) {
    unsigned long_ones = __ballot_sync(0xffffffffu, whole && threadIdx.x % G == 0);
    while (long_ones) {
        const int src = __ffs(long_ones) - 1;
        long_ones &= long_ones - 1;
        f(__shfl_sync(0xffffffffu, b, src), __shfl_sync(0xffffffffu, bs, src), __shfl_sync(0xffffffffu, begin, src),
          __shfl_sync(0xffffffffu, end, src));
    }
}

// 16-byte vectors of T: the unit of every coalesced load.
template <class T> struct VecOf {
    static const int N = 16 / sizeof(T);
    struct __align__(16) type { T v[16 / sizeof(T)]; };
};

// Whether an operation combines values in registers itself (OP::registers, OP::marked and
// OP::warp_all, for combine_registers, marked_pieces and warp_all): where a combine is a chain of
// several dependent instructions (lse.cuh's, an exp), a value at a time would make the thread
// wait on it.
template <class OP> struct OwnsRegisters { enum { value = 0 }; };

// The combination of the 32 lanes' values, in every lane (a butterfly of shuffles; an operation
// that combines registers itself, OwnsRegisters, has its own: lse.cuh's).
template <class A, class OP> __device__ __forceinline__ A warp_all(A v) {
    if constexpr (OwnsRegisters<OP>::value) return OP::warp_all(v);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = OP::combine(v, shfl_xor(v, o));
    return v;
}

// Combine one value per thread across the block; the result is valid in thread 0.
// A fixed tree (lanes, then warps in order): the same bits every run.  WAIT = false
// where the caller's previous use of shared is already behind a barrier.
template <class A, class OP, int THREADS, bool WAIT = true>
__device__ __forceinline__ A block_combine(A acc, A identity, A* shared) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc = OP::combine(acc, shfl_xor(acc, off));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (WAIT) __syncthreads();  // the previous use of shared is over
    if (lane == 0) shared[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < THREADS / 32 ? shared[lane] : identity;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) acc = OP::combine(acc, shfl_xor(acc, off));
    }
    return acc;
}

// The combination of a thread's N vectors of elements held in registers.
template <class A, class O, class OP, int N, class V>
__device__ __forceinline__ A combine_registers(const V (&vbuf)[N]) {
    if constexpr (OwnsRegisters<OP>::value) return OP::template registers<A>(vbuf);
    A acc = OP::template identity<O, A>();
#pragma unroll
    for (int k = 0; k < N; ++k) {
#pragma unroll
        for (int i = 0; i < (int)(sizeof(vbuf[k].v) / sizeof(vbuf[k].v[0])); ++i)
            acc = OP::combine(acc, to_acc<A>(vbuf[k].v[i]));
    }
    return acc;
}

// The branch-free pass over a thread's ITEMS consecutive elements in registers (vectors
// of VEC), with the segment starts among them marked in mask (bit i: element i): the
// piece that ends just before each mark i is stored at mine[i + (i / 16) * PAD] (the
// padded position, relative to the thread's first element, which begins a run of 16
// or lies in one with all of its ITEMS elements), and the piece open at the end is
// returned.  A select per element: no lane waits on another's branch.
template <class A, class O, class OP, int ITEMS, int VEC, int PAD, class V, int N>
__device__ __forceinline__ A marked_pieces(const V (&vbuf)[N], unsigned mask, A* mine) {
    if constexpr (OwnsRegisters<OP>::value) return OP::template marked<A, ITEMS, VEC, PAD>(vbuf, mask, mine);
    A acc = OP::template identity<O, A>();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const A v = to_acc<A>(vbuf[i / VEC].v[i % VEC]);
        const bool start = (mask >> i) & 1u;
        if (start) mine[i + (i >> 4) * PAD] = acc;
        acc = start ? v : OP::combine(acc, v);
    }
    return acc;
}

// Segmented inclusive scan over the lanes, where a lane with a mark (flag set in
// `starts`) begins a new segment: value becomes the combination of the lanes from
// the nearest such lane at or before this one (or lane 0).  One shuffle per step:
// the step adds the lane d below only where no mark lies between.
template <class A, class OP> __device__ __forceinline__ A warp_flag_scan(A value, unsigned starts, int lane) {
    const unsigned upto = starts & (0xffffffffu >> (31 - lane));
    const int lo = upto ? 31 - __clz(upto) : 0;  // the lowest lane this one may take from
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const A v_up = shfl_up(value, d);
        if (lane - d >= lo) value = OP::combine(v_up, value);
    }
    return value;
}
