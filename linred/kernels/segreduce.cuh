// Segmented reductions at memory bandwidth, compiled at run time with NVRTC.
//
// Three kernels and a fix-up:
//  - fixed_small: fixed-length segments whose length L is a power of two no
//    longer than 32 vectors.  Each thread loads 16-byte vectors; a segment lies
//    inside one vector (L <= VEC) or across L / VEC neighbouring lanes, reduced
//    with warp shuffles.  No shared memory, no offsets.
//  - fixed_rows: longer power-of-two lengths, up to 32 * UNROLL vectors: a warp
//    streams a contiguous run of rows and reduces R rows per segment.
//  - fixed_long: long fixed lengths of whole vectors: blocks reduce chunks of a
//    segment, and the last block of a segment adds their partials in order.
//  - tile_reduce: any segments (offsets, or a fixed length of any size).  A block
//    walks K consecutive tiles of TILE elements, staging each in shared memory
//    while the next one loads, and reduces every segment that intersects it:
//    sub-warp groups when the tile holds many segments, several warps per
//    segment when it holds few.  A segment open at the end of a tile is carried
//    to the next; one still open at the end of the block leaves a partial.
//  - features_reduce: segments of rows of several feature columns, one thread
//    per segment and group of consecutive features.
//  - tile_bounds: for offsets, the first segment of every tile of tile_reduce
//    (a binary search per tile; warp_reduce's warps search for their own).
//  - tile_fixup: one thread per block (or run) whose last segment continues
//    into later ones sums that segment's partials in a fixed order
//    (deterministic) and writes the result.
//
// Self-contained: NVRTC needs no headers (half and bfloat16 conversions use PTX).

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

// Shuffles move 32- or 64-bit words; narrow accumulators never occur (Promote).
template <class A> __device__ __forceinline__ A shfl_xor(A v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// ---- fixed_small --------------------------------------------------------------
template <class T> struct VecOf {
    static const int N = 16 / sizeof(T);
    struct __align__(16) type { T v[16 / sizeof(T)]; };
};

// x: N elements (N a multiple of L and of VEC), 16-byte aligned.  out: N / L results.
// Grid-stride over chunks of THREADS * UNROLL vectors.
template <class T, class A, class O, class OP, int L, bool MEAN, int THREADS, int UNROLL>
__device__ __forceinline__ void fixed_small(const T* __restrict__ x, O* __restrict__ out, i64 nvec) {
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    const V* xv = reinterpret_cast<const V*>(x);
    const i64 chunk = (i64)THREADS * UNROLL;
    for (i64 base = (i64)blockIdx.x * chunk; base < nvec; base += (i64)gridDim.x * chunk) {
        V buf[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 v = base + (i64)u * THREADS + threadIdx.x;
            if (v < nvec) buf[u] = xv[v];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 v = base + (i64)u * THREADS + threadIdx.x;
            const bool valid = v < nvec;
            if constexpr (L <= VEC) {
                if (valid) {
#pragma unroll
                    for (int k = 0; k < VEC / L; ++k) {
                        A acc = to_acc<A>(buf[u].v[k * L]);
#pragma unroll
                        for (int i = 1; i < L; ++i) acc = OP::combine(acc, to_acc<A>(buf[u].v[k * L + i]));
                        out[v * (VEC / L) + k] = finish<O, MEAN>(acc, L);
                    }
                }
            } else {
                constexpr int LANES = L / VEC;  // neighbouring lanes sharing one segment
                A acc = OP::template identity<O, A>();
                if (valid) {
                    acc = to_acc<A>(buf[u].v[0]);
#pragma unroll
                    for (int i = 1; i < VEC; ++i) acc = OP::combine(acc, to_acc<A>(buf[u].v[i]));
                }
#pragma unroll
                for (int off = LANES / 2; off > 0; off /= 2) acc = OP::combine(acc, shfl_xor(acc, off));
                if (valid && (threadIdx.x & (LANES - 1)) == 0) out[v / LANES] = finish<O, MEAN>(acc, L);
            }
        }
    }
}

// ---- fixed_rows -----------------------------------------------------------------
// Fixed lengths of R = L / (32 * VEC) warp-rows (R a power of two dividing UNROLL):
// each warp reduces a contiguous run of 32 * UNROLL vectors, one coalesced 512-byte
// row per load, so that a segment is R consecutive rows of one warp.  Each lane adds
// its R vectors, then the warp adds its lanes.  No shared memory, one launch.
template <class T, class A, class O, class OP, int L, bool MEAN, int THREADS, int UNROLL>
__device__ __forceinline__ void fixed_rows(const T* __restrict__ x, O* __restrict__ out, i64 nvec) {
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    constexpr int R = L / (32 * VEC);
    static_assert(R >= 1 && R * 32 * VEC == L && UNROLL % R == 0, "L must be 32 * VEC * R with R dividing UNROLL");
    const V* xv = reinterpret_cast<const V*>(x);
    const int lane = threadIdx.x & 31;
    const i64 warp_chunk = (i64)32 * UNROLL;
    const i64 chunk = (i64)THREADS * UNROLL;
    for (i64 base = (i64)blockIdx.x * chunk + (i64)(threadIdx.x >> 5) * warp_chunk; base < nvec;
         base += (i64)gridDim.x * chunk) {
        V buf[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 v = base + (i64)u * 32 + lane;
            if (v < nvec) buf[u] = xv[v];
        }
        // nvec is a multiple of 32 * R vectors: a segment is wholly in range or wholly out.
#pragma unroll
        for (int k = 0; k < UNROLL / R; ++k) {
            if (base + (i64)k * R * 32 >= nvec) break;
            A acc = to_acc<A>(buf[k * R].v[0]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int i = (r == 0 ? 1 : 0); i < VEC; ++i) acc = OP::combine(acc, to_acc<A>(buf[k * R + r].v[i]));
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2) acc = OP::combine(acc, shfl_xor(acc, off));
            if (lane == 0) out[base / (32 * R) + k] = finish<O, MEAN>(acc, L);
        }
    }
}

// ---- fixed_long -------------------------------------------------------------------
// Long fixed lengths of whole vectors (L = LV * VEC): segment s is cut into chunks of
// THREADS * UNROLL vectors, one block per chunk.  A segment of one chunk is written by
// its block; otherwise each block leaves its partial, and the block that finishes a
// segment's chunks last (a per-segment ticket) adds the partials in chunk order and
// writes the result: one launch, the same bits every run.  The last block sets the
// ticket back to zero for the next call.
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

template <class T, class A, class O, class OP, bool MEAN, int THREADS, int UNROLL>
__device__ __forceinline__ void fixed_long(const T* __restrict__ x, O* __restrict__ out, A* __restrict__ partials,
                                           unsigned* __restrict__ tickets, i64 LV, i64 chunks, i64 m) {
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    constexpr i64 CH = (i64)THREADS * UNROLL;
    __shared__ A shared[THREADS / 32];
    __shared__ bool last;
    const V* xv = reinterpret_cast<const V*>(x);
    for (i64 w = blockIdx.x; w < m * chunks; w += gridDim.x) {
        const i64 s = w / chunks, c = w - s * chunks;
        const i64 begin = s * LV + c * CH;
        const i64 end = min(begin + CH, (s + 1) * LV);
        V buf[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 v = begin + (i64)u * THREADS + threadIdx.x;
            if (v < end) buf[u] = xv[v];
        }
        A acc = OP::template identity<O, A>();
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (begin + (i64)u * THREADS + threadIdx.x < end) {
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc = OP::combine(acc, to_acc<A>(buf[u].v[i]));
            }
        }
        acc = block_combine<A, OP, THREADS>(acc, OP::template identity<O, A>(), shared);
        if (chunks == 1) {
            if (threadIdx.x == 0) out[s] = finish<O, MEAN>(acc, LV * VEC);
            continue;
        }
        if (threadIdx.x == 0) {
            partials[w] = acc;
            __threadfence();  // the partial is visible before the ticket says so
            last = atomicAdd(&tickets[s], 1u) == (unsigned)(chunks - 1);
        }
        __syncthreads();
        if (last) {  // uniform across the block
            __threadfence();
            A total = OP::template identity<O, A>();
            // A fixed assignment of partials to threads and a fixed tree: deterministic.
            for (i64 k = threadIdx.x; k < chunks; k += THREADS) {
                total = OP::combine(total, *(volatile A*)&partials[s * chunks + k]);
            }
            total = block_combine<A, OP, THREADS>(total, OP::template identity<O, A>(), shared);
            if (threadIdx.x == 0) {
                out[s] = finish<O, MEAN>(total, LV * VEC);
                tickets[s] = 0u;
            }
        }
    }
}

// The combination of a thread's N vectors of elements held in registers.
template <class A, class O, class OP, int N, class V>
__device__ __forceinline__ A combine_registers(const V (&vbuf)[N]) {
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

// ---- tile_reduce ---------------------------------------------------------------
// Segment boundaries: offsets[s] from an array, or s * L for a fixed length.
template <class I> struct ArrayOffsets {
    const I* __restrict__ p;
    __device__ __forceinline__ i64 operator()(i64 s) const { return (i64)p[s]; }
    // Lanes ask L2 for the 128-byte lines of the boundaries from s on: those of
    // `expect` boundaries and one more line (up to 32 lines).
    __device__ __forceinline__ void prefetch(i64 s, int lane, i64 expect) const {
        const int lines = 2 + (int)min(expect, (i64)(32 * 128)) * (int)sizeof(I) / 128;
        if (lane < lines) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + s + lane * (128 / (int)sizeof(I))));
    }
};
struct FixedOffsets {
    i64 L;
    __device__ __forceinline__ i64 operator()(i64 s) const { return s * L; }
    __device__ __forceinline__ void prefetch(i64, int, i64) const {}
};

// The first segment starting at or after tile j's first element: read from the
// bounds that tile_bounds computed, or computed directly for a fixed length.
template <class Off> __device__ __forceinline__ i64 segment_at_or_after(const Off&, const i64* bounds, i64 j, i64, i64) {
    return bounds[j];
}
__device__ __forceinline__ i64 segment_at_or_after(const FixedOffsets& off, const i64*, i64, i64 m, i64 v) {
    const i64 s = (v + off.L - 1) / off.L;
    return s < m ? s : m;
}

// The same for warp_reduce, found by the warp itself: a 32-way search over [0, m]
// (each step the lanes probe 32 evenly spaced offsets and a ballot narrows the range
// 32 times; 5 steps for 16 million segments, their loads mostly L2 hits shared with
// the neighbouring runs), in place of a binary search 24 loads deep.
template <class Off> __device__ __forceinline__ i64 warp_segment_at_or_after(const Off& off, i64 m, i64 v, int lane) {
    i64 lo = 0, hi = m;  // the answer lies in [lo, hi]; off(hi) >= v
    while (hi > lo) {
        const i64 step = (hi - lo + 31) >> 5;
        const i64 q = lo + lane * step;
        const unsigned below = __ballot_sync(0xffffffffu, q < hi && off(q) < v);
        const int c = __popc(below);  // probes 0 .. c - 1 lie below v, the others (or hi) at or past it
        if (c == 0) break;
        const i64 next = lo + (i64)c * step;
        lo += (i64)(c - 1) * step + 1;
        hi = min(next, hi);
    }
    return lo;
}
__device__ __forceinline__ i64 warp_segment_at_or_after(const FixedOffsets& off, i64 m, i64 v, int) {
    return segment_at_or_after(off, nullptr, 0, m, v);
}

// bounds[j] = the first s in [0, m] with off(s) >= min(j * TILE, n), for j in [0, tiles_per_row].
// One thread per tile boundary; the offsets are shared by every row.
template <int TILE, class Off> __device__ __forceinline__ void tile_bounds(Off off, i64 m, i64 n, i64 tiles_per_row, i64* bounds) {
    const i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j > tiles_per_row) return;
    const i64 v = min(j * (i64)TILE, n);
    i64 lo = 0, hi = m + 1;
    while (lo < hi) {
        const i64 mid = lo + ((hi - lo) >> 1);
        if (off(mid) < v) lo = mid + 1; else hi = mid;
    }
    bounds[j] = lo;
}

struct TileArgs {
    i64 n;              // elements per row
    i64 m;              // segments per row
    i64 row_stride;     // elements between rows of x
    i64 elem_stride;    // elements between consecutive elements of a row
    i64 tiles_per_row;
    i64 blocks_per_row; // each block reduces tiles_per_block consecutive tiles of one row
    i64 num_blocks;     // rows * blocks_per_row
    i64 tiles_per_block;
};

// The open segment a block carries from one of its tiles to the next.
enum { CARRY_NONE = 0, CARRY_FROM_BEFORE = 1, CARRY_OWN = 2 };

// Segmented inclusive scan over the lanes, where a lane with a mark (flag set in
// `starts`) begins a new segment: value becomes the combination of the lanes from
// the nearest such lane at or before this one (or lane 0).  One shuffle per step:
// the step adds the lane d below only where no mark lies between.
template <class A, class OP> __device__ __forceinline__ A warp_flag_scan(A value, unsigned starts, int lane) {
    const unsigned upto = starts & (0xffffffffu >> (31 - lane));
    const int lo = upto ? 31 - __clz(upto) : 0;  // the lowest lane this one may take from
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        const A v_up = __shfl_up_sync(0xffffffffu, value, d);
        if (lane - d >= lo) value = OP::combine(v_up, value);
    }
    return value;
}

// The same scan keyed by the position of each lane's last segment start (-1 when it
// has none; positions grow with the lane).  On return value is the segment open at
// the lane's end since its start (or since lane 0), key the position of that start
// (or -1): the key of the nearest lane with a start, one shuffle.
template <class A, class OP>
__device__ __forceinline__ void warp_keyed_scan(A& value, int& key) {
    const int lane = threadIdx.x & 31;
    const unsigned starts = __ballot_sync(0xffffffffu, key >= 0);
    value = warp_flag_scan<A, OP>(value, starts, lane);
    const unsigned upto = starts & (0xffffffffu >> (31 - lane));
    key = __shfl_sync(0xffffffffu, key, upto ? 31 - __clz(upto) : lane);
}

// Segmented scan over the block's threads keyed by the position of each thread's
// last segment start (-1 when it has none): a thread with a start begins a new
// segment.  Returns the thread's inclusive value (the segment open at its end)
// and sets *total_key to that segment's start; *ex_value and *ex_key are the same
// for the threads before it (identity and -1 when no start precedes it).  No
// barrier at the end: the caller's next use of warp_val is behind one.
template <class A, class OP, int THREADS>
__device__ __forceinline__ A block_keyed_scan(int key, A value, A identity, A* ex_value, int* ex_key, int* total_key,
                                              A* warp_val, int* warp_key) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int k = key;
    A v = value;
    warp_keyed_scan<A, OP>(v, k);
    if (lane == 31) {
        warp_val[warp] = v;
        warp_key[warp] = k;
    }
    __syncthreads();
    A carry = identity;
    int carry_key = -1;
    for (int w = warp - 1; w >= 0; --w) {  // the warps before this one, back to the last with a start
        carry = OP::combine(warp_val[w], carry);
        if (warp_key[w] >= 0) {
            carry_key = warp_key[w];
            break;
        }
    }
    if (k < 0) v = OP::combine(carry, v);
    k = max(k, carry_key);
    A pv = __shfl_up_sync(0xffffffffu, v, 1);
    int pk = __shfl_up_sync(0xffffffffu, k, 1);
    if (lane == 0) {
        pv = carry;
        pk = carry_key;
    }
    *ex_value = pv;
    *ex_key = pk;
    *total_key = k;
    return v;
}

// A block reduces K consecutive tiles of one row, staging each in shared memory
// while the loads of the next are in flight.  A segment that continues into the
// block's next tile is carried in shared memory, so partials leave the block only
// at its two ends: head[b] is the block's part of a segment that began before
// it; tail[b] the part of the last segment that began in it and continues past
// it, whose index is tail_seg[b] (-1 when there is none).
//
// Within a tile, four ways to share the work, by how many segments meet it:
//  - one (the tile lies inside a segment), with a 4-byte accumulator: every thread adds
//    its elements from registers, the block adds the threads' sums ("whole");
//  - a few (at most one per warp): several warps per segment;
//  - many, with their boundaries fitting in shared memory: every thread takes 16
//    consecutive elements whatever the segment lengths, finishes the segments
//    inside them, and a block-wide segmented scan joins the pieces of those that
//    cross threads ("balanced": no thread waits for another's long segment);
//  - more than TILE / 2 (a mean length under 2, mostly empty segments): one segment
//    per lane group.
// The balanced mode on a tile in registers with a 4-byte accumulator (float32 and
// 16-bit sums, 32-bit max/min) runs without divergent branches: the starts of the
// non-empty segments are marked in a bitmask (one bit per element) and a table of
// their indices; every thread adds its elements with a select at each marked
// start, storing the finished piece in shared memory, then writes the segments
// that lie inside its elements in a short loop over its marks.
// Shared memory is padded (16 bytes every 16 elements) so that threads reading
// their 16 consecutive elements hit distinct banks.
// The dynamic shared memory of tile_reduce: the staged tile (or the pieces of the
// branch-free mode), then the segment index table of that mode.  The backend
// computes the same sizes (linred/backends/nvrtc.py, _tile_shared_bytes).
template <class T, class A, int THREADS, int TILE, bool VECLOAD> struct TileShared {
    static const int PAD = 16 / (int)sizeof(A) > 0 ? 16 / (int)sizeof(A) : 1;
    static const int ITEMS = TILE / THREADS;
    static const bool FAST = VECLOAD && sizeof(A) == 4 && ITEMS <= 32 && 32 % ITEMS == 0;
    static const int STAGE_BYTES = ((TILE + TILE / 16 * PAD) * (int)sizeof(A) + 15) / 16 * 16;
    static const int BYTES = STAGE_BYTES + (FAST ? TILE * (int)sizeof(short) : 0);
};

template <class T, class A, class O, class OP, bool MEAN, int THREADS, int TILE, int K, bool VECLOAD, class Off>
__device__ __forceinline__ void tile_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, TileArgs a,
                                            const i64* __restrict__ bounds, A* __restrict__ head, A* __restrict__ tail,
                                            i64* __restrict__ tail_seg, unsigned char* __restrict__ smem) {
    typedef TileShared<T, A, THREADS, TILE, VECLOAD> S;
    constexpr int WARPS = THREADS / 32;
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    constexpr int NV = VECLOAD ? TILE / VEC / THREADS : 1;  // vectors per thread per tile
    constexpr int NS = VECLOAD ? 1 : TILE / THREADS;        // scalars per thread per tile
    constexpr int ITEMS = S::ITEMS;                         // elements per thread in balanced mode
    constexpr int PAD = S::PAD;                             // elements of padding after every 16
    // Boundaries the balanced modes can hold: a tile of up to TILE / 2 segments (mean
    // length 2) is still reduced in registers; shorter ones go to the lane groups.
    constexpr int CAP = TILE / 2;
    struct __align__(16) AV { A v[VecOf<T>::N]; };
    A* const sh = reinterpret_cast<A*>(smem);
    __shared__ int sb[CAP + 1];
    __shared__ A red[WARPS];
    __shared__ int red_flag[WARPS];
    __shared__ A carry_acc, next_acc;
    __shared__ i64 carry_s, next_s;
    __shared__ int carry_mode, next_mode;
    constexpr bool FAST = S::FAST;
    // Where the registers allow it (a 4-byte accumulator, no count to keep), a tile inside
    // one segment is summed from registers.
    constexpr bool WHOLE = sizeof(A) == 4 && !MEAN;
    constexpr int MARK_WORDS = TILE / 32;
    short* const seg_at = reinterpret_cast<short*>(smem + S::STAGE_BYTES);  // the non-empty segment starting at an element
    __shared__ unsigned marks[2][FAST ? MARK_WORDS : 1];     // its start, one bit per element (by tile parity)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    auto at = [](int e) { return e + (e >> 4) * PAD; };  // padded position of element e

    const i64 b = blockIdx.x;
    const i64 row = b / a.blocks_per_row;
    const i64 j0 = (b - row * a.blocks_per_row) * K;
    const i64 j1 = min(j0 + (i64)K, a.tiles_per_row);
    const T* xr = x + row * a.row_stride;
    O* outr = out + row * a.m;
    if (tid == 0) carry_mode = CARRY_NONE;
    if (FAST) {
        for (int w = tid; w < 2 * MARK_WORDS; w += THREADS) marks[w / MARK_WORDS][w % MARK_WORDS] = 0;
        __syncthreads();
    }

    // Vector loads are blocked (each thread its own ITEMS consecutive elements, what the
    // balanced mode reduces in registers) where the block's tiles hold many segments,
    // and warp-striped (fully coalesced, for staging) where they hold few.
    const i64 seg_j0 = segment_at_or_after(off, bounds, j0, a.m, j0 * (i64)TILE);
    const i64 seg_j1 = segment_at_or_after(off, bounds, j1, a.m, min(j1 * (i64)TILE, a.n));
    const bool blocked = VECLOAD && seg_j1 - seg_j0 > (i64)WARPS * (j1 - j0);
    V vbuf[NV];
    T sbuf[NS];
    auto fetch = [&](i64 j) {  // issue the loads of tile j (no use yet)
        const i64 t0 = j * (i64)TILE;
        const int count = (int)(min(t0 + (i64)TILE, a.n) - t0);
        if (VECLOAD) {
            if (count == TILE) {
                const V* xv = reinterpret_cast<const V*>(xr + t0);
#pragma unroll
                for (int k = 0; k < NV; ++k) vbuf[k] = xv[blocked ? tid * NV + k : k * THREADS + tid];
            }
        } else {
#pragma unroll
            for (int k = 0; k < NS; ++k) {
                const int i = k * THREADS + tid;
                if (i < count) sbuf[k] = xr[(t0 + i) * a.elem_stride];
            }
        }
    };
    fetch(j0);

    for (i64 j = j0; j < j1; ++j) {
        const i64 t0 = j * (i64)TILE;
        const i64 t1 = min(t0 + (i64)TILE, a.n);
        const int count = (int)(t1 - t0);
        // The tile's segments: owned ones start inside it (the row's last tile also
        // owns the empty segments at n); the head is the segment it continues.
        const i64 s_first = segment_at_or_after(off, bounds, j, a.m, t0);
        const i64 s_last = (t1 == a.n) ? a.m - 1 : segment_at_or_after(off, bounds, j + 1, a.m, t1) - 1;
        // off(m) == n > t0, so s_first == m also means the tile continues an earlier segment.
        const i64 s_head = (s_first > 0 && off(s_first) > t0) ? s_first - 1 : -1;
        const i64 owned = s_last - s_first + 1;
        const i64 items = owned + (s_head >= 0 ? 1 : 0);
        const bool balanced = items > WARPS && owned + 1 <= CAP;
        // A full vector-loaded tile is already in registers, ITEMS consecutive elements
        // per thread: the balanced mode reduces it there; the others need it staged.
        const bool in_regs = VECLOAD && count == TILE;
        // A tile inside one segment (owned == 0, so items == 1: the head) is summed from
        // registers too.
        const bool whole = WHOLE && in_regs && owned == 0;
        const bool stage = !whole && !(balanced && in_regs && blocked);
        const bool fast = FAST && !stage;
        const int parity = (int)(j & 1);
        // Stage the tile in shared memory, in the accumulator type.
        if (stage && in_regs) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                AV w;
#pragma unroll
                for (int i = 0; i < VEC; ++i) w.v[i] = to_acc<A>(vbuf[k].v[i]);
                *reinterpret_cast<AV*>(sh + at(blocked ? tid * ITEMS + k * VEC : (k * THREADS + tid) * VEC)) = w;
            }
        } else if (stage && VECLOAD) {  // the ragged last tile of a row
            for (int i = tid; i < count; i += THREADS) sh[at(i)] = to_acc<A>(xr[t0 + i]);
        } else if (stage) {
#pragma unroll
            for (int k = 0; k < NS; ++k) {
                const int i = k * THREADS + tid;
                if (i < count) sh[at(i)] = to_acc<A>(sbuf[k]);
            }
        }
        if (balanced) {  // the owned segments' starts, then the end of the last, relative to t0
            // Owned segment k, [begin, end) (end unused for k == owned, the end of the last).
            auto note = [&](i64 k, i64 begin, i64 end) {
                const i64 v = begin - t0;
                sb[k] = (int)(v < (i64)count ? v : (i64)count + 1);  // past the tile: count + 1
                if (fast && k < owned && v < (i64)count && end > begin) {
                    atomicOr(&marks[parity][(int)v >> 5], 1u << ((int)v & 31));
                    seg_at[(int)v] = (short)k;
                }
            };
            // Two segments per thread at a time, their boundaries loaded together: a tile of
            // short segments has several per thread, and one load after another would
            // expose each one's latency (4 at a time measured no better, and spills).
            constexpr int BATCH = 2;
            for (i64 k0 = tid; k0 <= owned; k0 += BATCH * THREADS) {
                i64 begin[BATCH], end[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    const i64 k = k0 + u * THREADS;
                    begin[u] = k <= owned ? off(s_first + k) : 0;
                    end[u] = fast && k < owned ? off(s_first + k + 1) : 0;
                }
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    if (k0 + u * THREADS <= owned) note(k0 + u * THREADS, begin[u], end[u]);
                }
            }
        }
        if (FAST) {  // the next tile's marks (this one's were read before the last barrier)
            for (int w = tid; w < MARK_WORDS; w += THREADS) marks[parity ^ 1][w] = 0;
        }
        if (tid == 0) next_mode = CARRY_NONE;
        __syncthreads();
        if (stage && j + 1 < j1) fetch(j + 1);  // in flight while this tile is reduced

        // A finished item: the head piece joins the carried part of its segment.
        auto emit = [&](bool is_head, i64 s, i64 begin, i64 end, A acc) {
            if (is_head) {
                const int mode = carry_mode == CARRY_NONE ? CARRY_FROM_BEFORE : carry_mode;
                const A total = carry_mode == CARRY_NONE ? acc : OP::combine(carry_acc, acc);
                if (end > t1) {  // still open: carry it on
                    next_s = s;
                    next_acc = total;
                    next_mode = mode;
                } else if (mode == CARRY_OWN) {
                    outr[s] = finish<O, MEAN>(total, end - begin);
                } else {
                    head[b] = total;  // the block's whole part of a segment begun before it
                }
            } else if (end > t1) {
                next_s = s;
                next_acc = acc;
                next_mode = CARRY_OWN;
            } else {
                outr[s] = finish<O, MEAN>(acc, end - begin);
            }
        };

        if (whole) {
            // Inside one segment: the threads' sums join.
            A acc = combine_registers<A, O, OP>(vbuf);
            if (j + 1 < j1) fetch(j + 1);  // the registers are free again
            // red's last use, in the previous tile, is behind the end-of-tile barrier.
            acc = block_combine<A, OP, THREADS, false>(acc, OP::template identity<O, A>(), red);
            if (tid == 0) emit(true, s_head, off(s_head), off(s_first), acc);
        } else if (items <= WARPS) {
            // Few segments: WARPS / items warps per segment, partials combined in shared memory.
            const int per = WARPS / (int)items;
            const int item = warp % (int)items, part = warp / (int)items;
            A acc = OP::template identity<O, A>();
            if (part < per) {
                const i64 s = (s_head >= 0) ? (item == 0 ? s_head : s_first + item - 1) : s_first + item;
                const int lo = (int)(max(off(s), t0) - t0), hi = (int)(min(off(s + 1), t1) - t0);
                for (int i = lo + part * 32 + lane; i < hi; i += per * 32) acc = OP::combine(acc, sh[at(i)]);
            }
#pragma unroll
            for (int o = 16; o > 0; o /= 2) acc = OP::combine(acc, shfl_xor(acc, o));
            if (lane == 0) red[warp] = acc;
            __syncthreads();
            if (tid < items) {
                A total = red[tid];
                for (int p = 1; p < per; ++p) total = OP::combine(total, red[tid + p * (int)items]);
                const bool is_head = s_head >= 0 && tid == 0;
                const i64 s = (s_head >= 0) ? (is_head ? s_head : s_first + tid - 1) : s_first + tid;
                emit(is_head, s, off(s), off(s + 1), total);
            }
        } else if (fast) {
            // Thread tid holds elements [r0, r0 + ITEMS) of a full tile.  sh[at(p)] gets the
            // piece that ends just before a marked start p.
            const A identity = OP::template identity<O, A>();
            const int r0 = tid * ITEMS;
            unsigned mask = marks[parity][r0 >> 5];
            if (ITEMS < 32) mask = (mask >> (r0 & 31)) & ((1u << (ITEMS & 31)) - 1u);
            // ITEMS divides 32, so r0 begins a run of 16 elements or lies in one with all
            // of the thread's: the padding of r0 + i is known from i alone, one address for
            // all the thread's stores.
            A acc = marked_pieces<A, O, OP, ITEMS, VEC, PAD>(vbuf, mask, sh + at(r0));
            if (j + 1 < j1) fetch(j + 1);  // the registers are free again
            A before;
            int before_key, total_key;
            const int key = mask ? r0 + 31 - __clz(mask) : -1;
            const A total = block_keyed_scan<A, OP, THREADS>(key, acc, identity, &before, &before_key, &total_key,
                                                             red, red_flag);
            if (mask) {
                unsigned m = mask;
                int p = r0 + __ffs(m) - 1;
                m &= m - 1;
                // The segment open at r0 ends before the first start p.
                const A first = OP::combine(before, sh[at(p)]);
                if (before_key >= 0) {
                    emit(false, s_first + seg_at[before_key], t0 + before_key, t0 + p, first);
                } else if (s_head >= 0) {
                    emit(true, s_head, off(s_head), t0 + p, first);
                }
                for (int prev = p; m; prev = p) {  // the segments inside this thread's elements
                    p = r0 + __ffs(m) - 1;
                    m &= m - 1;
                    outr[s_first + seg_at[prev]] = finish<O, MEAN>(sh[at(p)], p - prev);
                }
            }
            if (tid == THREADS - 1) {  // the segment open at the tile's end
                if (total_key >= 0) {
                    const i64 s = s_first + seg_at[total_key];
                    emit(false, s, t0 + total_key, off(s + 1), total);
                } else if (s_head >= 0) {
                    emit(true, s_head, off(s_head), off(s_head + 1), total);
                }
            }
            for (i64 k = tid; k < owned; k += THREADS) {  // empty segments hold no element
                if (sb[k] == sb[k + 1]) outr[s_first + k] = finish<O, MEAN>(identity, 0);
            }
        } else if (balanced) {
            // Thread tid walks elements [r0, r1); owned segment k starts at sb[k] and
            // ends at sb[k + 1]; k = -1 is the head segment, which began before the tile.
            const A identity = OP::template identity<O, A>();
            const int r0 = tid * ITEMS, r1 = min(r0 + ITEMS, count);
            const bool active = r0 < count;
            int lo = 0, hi = (int)owned + 1;  // the segment holding r0: the last k with sb[k] <= r0
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (sb[mid] <= r0) lo = mid + 1; else hi = mid;
            }
            const int k0 = lo - 1;
            const bool first_open = k0 < 0 || sb[k0] < r0;  // it began before this thread's elements
            int cur = k0, end = sb[k0 + 1];
            A acc = identity, first = identity;
            bool first_closed = false;
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                const int e = r0 + i;
                if (e < r1) {
                    while (e >= end) {  // segment cur ended before e
                        if (cur == k0 && first_open) {
                            first = acc;  // to be joined with the earlier threads' pieces
                            first_closed = true;
                        } else if (sb[cur] < end) {  // began and ended in this thread
                            outr[s_first + cur] = finish<O, MEAN>(acc, end - sb[cur]);
                        }
                        acc = identity;
                        ++cur;
                        end = sb[cur + 1];
                    }
                    const A v = stage ? sh[at(e)] : to_acc<A>(vbuf[i / VEC].v[i % VEC]);
                    acc = OP::combine(acc, v);
                }
            }
            if (!stage && j + 1 < j1) fetch(j + 1);  // the registers are free again
            // Join each thread's open segment (the one holding r1 - 1) with that
            // segment's pieces in the threads before it.
            const bool starts_here = !active || first_closed || !first_open;
            A before;
            int before_key, total_key;  // unused: the segments are known from cur and k0
            const A total = block_keyed_scan<A, OP, THREADS>(starts_here ? tid : -1, acc, identity, &before, &before_key,
                                                             &total_key, red, red_flag);
            if (active) {
                if (first_closed) {  // the segment at r0 ended inside this thread
                    const i64 s = k0 < 0 ? s_head : s_first + k0;
                    emit(k0 < 0, s, off(s), off(s + 1), OP::combine(before, first));
                }
                // The last thread holding the open segment finishes or carries it: the
                // segment ends at r1, or this is the tile's last thread.
                if (end <= r1 || r1 == count) {
                    const i64 s = cur < 0 ? s_head : s_first + cur;
                    emit(cur < 0, s, off(s), off(s + 1), total);
                }
            }
            // Empty owned segments hold no element: they get the identity here.
            for (i64 k = tid; k < owned; k += THREADS) {
                if (sb[k] == sb[k + 1]) outr[s_first + k] = finish<O, MEAN>(identity, 0);
            }
        } else {
            // Many segments: groups of G lanes, G a power of two from 32 down to 1.
            int G = 32;
            while (G > 1 && (i64)(THREADS / G) < items) G >>= 1;
            const int groups = THREADS / G, g = tid / G, gl = tid & (G - 1);
            const i64 rounds = (items + groups - 1) / groups;
            for (i64 r = 0; r < rounds; ++r) {
                const i64 item = r * groups + g;
                const bool valid = item < items;
                const bool is_head = valid && s_head >= 0 && item == 0;
                i64 s = 0, begin = 0, end = 0;
                A acc = OP::template identity<O, A>();
                if (valid) {
                    s = (s_head >= 0) ? (is_head ? s_head : s_first + item - 1) : s_first + item;
                    begin = off(s);
                    end = off(s + 1);
                    const int lo = (int)(max(begin, t0) - t0), hi = (int)(min(end, t1) - t0);
                    for (int i = lo + gl; i < hi; i += G) acc = OP::combine(acc, sh[at(i)]);
                }
                for (int o = G / 2; o > 0; o /= 2) acc = OP::combine(acc, shfl_xor(acc, o));
                if (valid && gl == 0) emit(is_head, s, begin, end, acc);
            }
        }
        __syncthreads();  // sh, sb, red and next_* are complete
        if (tid == 0) {
            carry_mode = next_mode;
            carry_s = next_s;
            carry_acc = next_acc;
        }
        // The next tile's staging barrier orders this update before its readers.
    }
    if (tid == 0) {  // thread 0 wrote the carry itself: no barrier needed
        i64 open = -1;
        if (carry_mode == CARRY_OWN) {
            tail[b] = carry_acc;
            open = carry_s;
        } else if (carry_mode == CARRY_FROM_BEFORE) {
            head[b] = carry_acc;  // the segment continues past this block too
        }
        tail_seg[b] = open;
    }
}

// ---- warp_reduce ---------------------------------------------------------------
// Any segments of contiguous, 16-byte aligned rows.  Every warp walks up to K
// consecutive warp tiles of 32 * ITEMS elements on its own (no block barriers):
// each lane holds ITEMS consecutive elements in registers, loaded a tile ahead (or,
// for a tile known to lie inside one segment, ITEMS from 32-vector strided loads).
// Per tile, the lanes read the offsets of the segments starting in it (64 at a
// time, ballot-counted, so the next tile's first segment follows without a search)
// and mark the starts of the non-empty ones in a bitmask.  Every lane adds its
// elements with a select at each mark, storing each finished piece in shared memory
// at the mark's position; a segmented warp scan (a lane with a mark starts a new
// segment) joins the pieces that cross lanes, after which every mark holds the
// segment that ends there.  The lanes then write the tile's segments 32 at a time,
// in order (the first 64 from what they noted while reading the offsets), the
// empty ones included.  The segment open at a tile's end is carried in registers
// to the next tile and is finished there, at the next tile's first mark; one still
// open at the end of the warp's run leaves a partial for tile_fixup, as
// tile_reduce's blocks do.  A tile with no segment start is summed from registers
// and a warp reduction; the tile before it knows (where the next segment starts),
// so its offsets are not read.  Each warp finds its run's first segment itself
// (warp_segment_at_or_after).
template <class T, class A> struct WarpShared {
    static const int VEC = VecOf<T>::N;
    static const int ITEMS = VEC > (sizeof(A) == 8 ? 8 : 16) ? VEC : (sizeof(A) == 8 ? 8 : 16);
    static const int WT = 32 * ITEMS;  // elements per warp tile
    static const int PAD = 16 / (int)sizeof(A) > 0 ? 16 / (int)sizeof(A) : 1;
    // Pieces (padded: 16 bytes every 16 elements, so lanes storing at the same item
    // hit different banks), the marks.
    static const int PIECE_BYTES = ((WT + WT / 16 * PAD) * (int)sizeof(A) + 15) / 16 * 16;
    static const int MARK_WORDS = (WT + 31) / 32;
    // Values that live from tile to tile but are seldom read, kept here rather than in
    // registers (the kernel is at its register limit): see WarpState.
    static const int STATE_BYTES = 48;
    static const int WARP_BYTES = PIECE_BYTES + MARK_WORDS * 4 + STATE_BYTES;
};
struct WarpState {
    i64 carry_s;      // the segment carried in registers, when it began in this warp's tiles
    i64 carry_begin;  // and its first element
    i64 next_begin;   // where the first segment not yet owned starts (-1: not known)
    i64 open_s;       // the tile's last non-empty segment (open at the tile's end)
    i64 open_begin;   // and its first element
};

template <class T, class A, class O, class OP, bool MEAN, int THREADS, int K, class Off>
__device__ __forceinline__ void warp_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, TileArgs a,
                                            A* __restrict__ head, A* __restrict__ tail,
                                            i64* __restrict__ tail_seg, A* __restrict__ group_head,
                                            unsigned char* __restrict__ smem) {
    typedef WarpShared<T, A> S;
    typedef typename VecOf<T>::type V;
    constexpr int VEC = S::VEC, ITEMS = S::ITEMS, NVL = ITEMS / VEC, WT = S::WT, PAD = S::PAD;
    constexpr int WARPS = THREADS / 32;
    // Segment offsets read per lane at a time: two batches of 32 (one measured 3-4% slower).
    constexpr int WB = 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * WARPS + warp;  // this warp's run of tiles
    const bool active = c < a.num_blocks;           // the last block's spare warps only reach its barrier
    unsigned char* const mem = smem + warp * S::WARP_BYTES;
    A* const sh = reinterpret_cast<A*>(mem);
    unsigned* const marks = reinterpret_cast<unsigned*>(mem + S::PIECE_BYTES);
    WarpState* const st = reinterpret_cast<WarpState*>(mem + S::PIECE_BYTES + S::MARK_WORDS * 4);
    auto at = [](int e) { return e + (e >> 4) * PAD; };  // padded position of element e

    const i64 row = c / a.blocks_per_row;
    const i64 cj = c - row * a.blocks_per_row;
    const i64 j0 = cj * K;
    const i64 j1 = active ? min(j0 + (i64)K, a.tiles_per_row) : j0;
    const T* xr = x + row * a.row_stride;
    O* outr = out + row * a.m;
    const int r0 = lane * ITEMS;
    A* const mine = sh + at(r0);  // at(r0 + i) == at(r0) + i + (i >> 4) * PAD
    const A identity = OP::template identity<O, A>();

    V vbuf[NVL];
    auto fetch = [&](i64 j) {  // issue the loads of tile j (no use yet)
        const i64 t0 = j * (i64)WT;
        if (t0 + WT <= a.n) {
            // A tile known to lie inside one segment (one the loop below skips) is summed
            // in any order: each load takes 32 consecutive vectors, not every lane its own
            // (+1 point of copy at geometric mean 8192 and zipf on an H100).
            const bool striped = t0 + WT < a.n && st->next_begin >= t0 + WT;
            const V* xv = reinterpret_cast<const V*>(xr + t0);
            const int first = striped ? lane : lane * NVL, step = striped ? 32 : 1;
#pragma unroll
            for (int k = 0; k < NVL; ++k) vbuf[k] = xv[first + k * step];
        } else {  // the row's ragged last tile: nothing is read past n
#pragma unroll
            for (int k = 0; k < NVL; ++k) {
#pragma unroll
                for (int i = 0; i < VEC; ++i) {
                    const i64 e = t0 + r0 + k * VEC + i;
                    // Zeros past n (they join no segment): keeping the old values instead
                    // made the compiler copy all of vbuf twice per tile (+7% instructions).
                    vbuf[k].v[i] = e < a.n ? xr[e] : T();
                }
            }
        }
    };
    if (lane == 0) st->next_begin = -1;  // fetch reads it
    __syncwarp();
    if (active) fetch(j0);

    // The segment open at the end of the previous tile: none yet, one that began before
    // this warp's tiles (its part goes to head[c]), or one of its own (index, start).
    int mode = CARRY_NONE;
    A carry = identity;
    i64 s_first = active ? warp_segment_at_or_after(off, a.m, j0 * (i64)WT, lane) : 0;  // first segment at or after t0
    const int tiles = (int)(j1 - j0);  // K at most: an int counter, two registers fewer than an i64
    for (int jt = 0; jt < tiles; ++jt) {
        const i64 j = j0 + jt;
        const i64 t0 = j * (i64)WT;
        const i64 t1 = min(t0 + (i64)WT, a.n);
        const int count = (int)(t1 - t0);
        const bool last = t1 == a.n;  // the row's last tile also owns the empty segments at n
        // A segment ends in the tile where it ends before fin (a ragged tile's mark at
        // count finishes the row's last segment there).
        const int fin = count + (last && count < WT ? 1 : 0);
        // No segment starts in the tile when the one after the previous tile's segments
        // starts past it: its offsets are not read at all.  fetch's `striped` is this same
        // test (t0 + WT < n is !last), written out there: a shared helper changed the
        // machine code (2 registers, 8 instructions more) for the same result.
        const bool skip = !last && st->next_begin >= t1;
        i64 owned = 0;
        // Where an owned segment [b, e) ends in the tile: its position, -2 when it is
        // empty, -1 when it ends past the tile (carried) or is not owned.
        auto ends_at = [&](i64 b, i64 e) { return e == b ? -2 : e - t0 < fin ? (int)(e - t0) : -1; };
        // ... and its result, written from the pieces once every mark holds the segment
        // that ends there (len is read only where the segment ends in the tile).
        auto write = [&](i64 s, int w, int len) {
            if (w == -1) return;
            const A v = sh[at(max(w, 0))];
            outr[s] = w == -2 ? finish<O, MEAN>(identity, 0) : finish<O, MEAN>(v, len);
        };
        // What the first 64 segments' lanes note while reading the offsets, for write.
        int where[WB], len[WB];
#pragma unroll
        for (int u = 0; u < WB; ++u) where[u] = len[u] = -1;
        if (!skip) {
            if (lane < S::MARK_WORDS) marks[lane] = 0;
            __syncwarp();
            // The segments starting in the tile, 64 at a time until one falls past it (where
            // that one starts is kept in next_begin).
            for (;;) {
                // Every batch's loads go out before the first is used: one wait for L2, not WB.
                i64 begins[WB], ends[WB];
#pragma unroll
                for (int u = 0; u < WB; ++u) {
                    const i64 s = s_first + owned + u * 32 + lane;
                    begins[u] = ends[u] = a.n;
                    if (s < a.m) {
                        begins[u] = off(s);
                        ends[u] = off(s + 1);
                    }
                }
                unsigned ball[WB];
                int got = 0;
#pragma unroll
                for (int u = 0; u < WB; ++u) {
                    const i64 s = s_first + owned + u * 32 + lane;
                    const i64 begin = begins[u], end = ends[u];
                    const bool in = s < a.m && (last || begin < t1);
                    ball[u] = __ballot_sync(0xffffffffu, in);
                    if (got == 32 * u && lane == __ffs(~ball[u]) - 1) st->next_begin = begin;  // the first one out
                    if (owned == 0) {
                        where[u] = in ? ends_at(begin, end) : -1;
                        len[u] = (int)(end - begin);
                    }
                    if (in && end > begin) {
                        const int v = (int)(begin - t0);
                        atomicOr(&marks[v >> 5], 1u << (v & 31));
                        if (end >= t1) {  // the tile's last non-empty segment
                            st->open_s = s;
                            st->open_begin = begin;
                        }
                    }
                    got += __popc(ball[u]);
                }
                owned += got;
                if (got < 32 * WB) break;
            }
            // The next tile's offsets, into L2: as many as this tile had.
            if (!last) off.prefetch(s_first + owned, lane, owned);
            // Past the end of a ragged tile: a mark, so that what lies there joins no segment.
            if (count < WT && lane == 0) atomicOr(&marks[count >> 5], 1u << (count & 31));
            __syncwarp();
        }
        if (owned == 0 && count == WT) {
            // Inside one segment: the lanes' sums join the carried one.
            A acc = combine_registers<A, O, OP>(vbuf);
            if (jt + 1 < tiles) fetch(j + 1);  // the registers are free again
#pragma unroll
            for (int o = 16; o > 0; o /= 2) acc = OP::combine(acc, shfl_xor(acc, o));
            carry = OP::combine(carry, acc);
            if (mode == CARRY_NONE) mode = CARRY_FROM_BEFORE;
        } else {
            unsigned mask = marks[r0 >> 5];
            if (ITEMS < 32) mask = (mask >> (r0 & 31)) & ((1u << (ITEMS & 31)) - 1u);
            A acc = marked_pieces<A, O, OP, ITEMS, VEC, PAD>(vbuf, mask, mine);
            if (jt + 1 < tiles) fetch(j + 1);  // the registers are free again
            // The value of the segment open at the lane's end, since its start in the tile
            // (where a lane at or before this one has a mark) or since t0.
            const unsigned starts = __ballot_sync(0xffffffffu, mask != 0);
            acc = warp_flag_scan<A, OP>(acc, starts, lane);
            A before = __shfl_up_sync(0xffffffffu, acc, 1);
            if (lane == 0) before = identity;
            const A total = __shfl_sync(0xffffffffu, acc, 31);
            if (mask) {
                const int p = r0 + __ffs(mask) - 1;
                // The segment open at r0 ends at the lane's first mark p.
                const A first = OP::combine(before, sh[at(p)]);
                if (starts & ((1u << lane) - 1u)) {  // it began at an earlier lane's mark
                    sh[at(p)] = first;
                } else if (mode == CARRY_OWN) {
                    outr[st->carry_s] = finish<O, MEAN>(OP::combine(carry, first), t0 + p - st->carry_begin);
                } else if (mode == CARRY_FROM_BEFORE || p > 0) {  // it began before this warp's tiles
                    head[c] = OP::combine(carry, first);
                }
            }
            __syncwarp();  // every mark holds the segment that ends there
            // The tile's segments that end in it, and its empty ones, in order.
#pragma unroll
            for (int u = 0; u < WB; ++u) write(s_first + u * 32 + lane, where[u], len[u]);
            for (i64 k = 32 * WB + lane; k < owned; k += 32) {  // more than 64: their offsets again
                const i64 s = s_first + k;
                const i64 b = off(s), e = off(s + 1);
                write(s, ends_at(b, e), (int)(e - b));
            }
            if (starts) {  // the segment open at the tile's end began in it
                mode = CARRY_OWN;
                carry = total;
                __syncwarp();  // the carried segment's state was read
                if (lane == 0) {
                    st->carry_s = st->open_s;
                    st->carry_begin = st->open_begin;
                }
            } else {
                carry = OP::combine(carry, total);
                if (mode == CARRY_NONE) mode = CARRY_FROM_BEFORE;
            }
        }
        if (last) {
            // A ragged tile's mark at count finished the row's last segment; a full one
            // leaves it open here, at n.
            if (count == WT && lane == 0) {
                if (mode == CARRY_OWN) outr[st->carry_s] = finish<O, MEAN>(carry, a.n - st->carry_begin);
                else if (mode == CARRY_FROM_BEFORE) head[c] = carry;
            }
            mode = CARRY_NONE;
        }
        s_first += owned;
        __syncwarp();  // the tile's marks and pieces are read
    }
    __shared__ A run_head[WARPS];
    if (lane == 0) {
        if (active) {
            if (mode == CARRY_OWN) tail[c] = carry;
            else if (mode == CARRY_FROM_BEFORE) head[c] = carry;
            tail_seg[c] = mode == CARRY_OWN ? st->carry_s : -1;
        }
        run_head[warp] = carry;  // the run's sum where it lies inside one segment
    }
    // The block's runs are consecutive: their heads joined, for segments that span
    // whole blocks (tile_fixup reads this only where all of them lie inside one).
    __syncthreads();
    if (threadIdx.x == 0) {
        A g = run_head[0];
#pragma unroll
        for (int w = 1; w < WARPS; ++w) g = OP::combine(g, run_head[w]);
        group_head[blockIdx.x] = g;
    }
}

// ---- features: segments of rows of D feature columns -----------------------------
// out[r, s, f] = reduce over rows i in [off(s), off(s + 1)) of x[r, i, f], for data
// whose feature columns are contiguous.  One thread per (row of the batch, segment,
// group of W consecutive features), walking the segment's rows with UNROLL loads in
// flight; neighbouring lanes read neighbouring feature groups of the same row, so
// every load is coalesced.  W = 16 bytes of features where rows are 16-byte aligned,
// else 1; results go out as 16-byte vectors where W results fill whole ones (the
// caller only passes such a W when the result rows are 16-byte aligned).
template <class T, int W> struct Group { struct __align__(W * sizeof(T) >= 16 ? 16 : sizeof(T)) type { T v[W]; }; };

struct FeatureArgs {
    i64 n;            // rows per batch row
    i64 m;            // segments per batch row
    i64 batch_stride; // elements between batch rows of x
    i64 row_stride;   // elements between rows of x
    i64 features;     // D
    i64 groups;       // feature groups per row: D / W
    i64 total;        // batch * m * groups threads
};

// A thread of features_reduce adds a segment's rows one after another: in float32 a long
// segment would lose digits (each addition rounds to the running sum's precision; 2^22 rows
// of positive data came out 4e-3 off), so float32 sums are accumulated in double there.
// The kernel is memory-bound: the wider additions cost no time.
template <class OP, class A> struct SumWide { typedef A type; };
template <> struct SumWide<OpSum, float> { typedef double type; };

template <class T, class A0, class O, class OP, bool MEAN, int W, int UNROLL, class Off>
__device__ __forceinline__ void features_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, FeatureArgs a) {
    typedef typename Group<T, W>::type G;
    typedef typename SumWide<OP, A0>::type A;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < a.total; t += stride) {
        const i64 g = t % a.groups, rs = t / a.groups;  // rs: batch row * m + segment
        const i64 r = rs / a.m, s = rs - r * a.m;
        const i64 begin = off(s), end = off(s + 1);
        const T* p = x + r * a.batch_stride + g * W;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
        i64 i = begin;
        for (; i + UNROLL <= end; i += UNROLL) {
            G buf[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) buf[u] = *reinterpret_cast<const G*>(p + (i + u) * a.row_stride);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(buf[u].v[k]));
            }
        }
        for (; i < end; ++i) {
            const G v = *reinterpret_cast<const G*>(p + i * a.row_stride);
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(v.v[k]));
        }
        O* o = out + rs * a.features + g * W;
        if constexpr ((W * sizeof(O)) % 16 == 0) {  // whole 16-byte vectors of results
            typedef typename VecOf<O>::type VO;
            constexpr int NO = VecOf<O>::N;
#pragma unroll
            for (int c = 0; c < W / NO; ++c) {
                VO r;
#pragma unroll
                for (int k = 0; k < NO; ++k) r.v[k] = finish<O, MEAN>(acc[c * NO + k], end - begin);
                *reinterpret_cast<VO*>(o + c * NO) = r;
            }
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], end - begin);
        }
    }
}

// Adds h[lo], ..., h[hi - 1] across the warp's lanes, four loads in flight per lane
// (a fixed order: deterministic); every lane gets its own part.
template <class A, class O, class OP>
__device__ __forceinline__ A warp_range(const A* __restrict__ h, i64 lo, i64 hi, int lane) {
    A acc0 = OP::template identity<O, A>(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    i64 k = lo + lane;
    for (; k + 96 < hi; k += 128) {
        acc0 = OP::combine(acc0, h[k]);
        acc1 = OP::combine(acc1, h[k + 32]);
        acc2 = OP::combine(acc2, h[k + 64]);
        acc3 = OP::combine(acc3, h[k + 96]);
    }
    for (; k < hi; k += 32) acc0 = OP::combine(acc0, h[k]);
    return OP::combine(OP::combine(acc0, acc1), OP::combine(acc2, acc3));
}

// One thread per run b (a block of tile_reduce, a warp's run of warp_reduce) whose
// last segment continues into later runs: it is completed from the head pieces of
// the runs it covers, summed in a fixed order (deterministic).  A thread adds up to
// SHORT heads itself, with their loads in flight together; longer spans are taken
// by the whole warp, one at a time.  With G > 1, group_head[g] holds the sum of
// head[g * G .. g * G + G - 1], valid where those runs lie inside one segment,
// which is where it is read: a segment spanning thousands of runs reads G times
// fewer partials.
template <class T, class A, class O, class OP, bool MEAN, int TILE, int G, class Off>
__device__ __forceinline__ void tile_fixup(O* __restrict__ out, Off off, TileArgs a, const A* __restrict__ head,
                                           const A* __restrict__ tail, const i64* __restrict__ tail_seg,
                                           const A* __restrict__ group_head) {
    constexpr int SHORT = 4;
    const int lane = threadIdx.x & 31;
    const i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const A identity = OP::template identity<O, A>();
    const i64 s = b < a.num_blocks ? tail_seg[b] : -1;
    i64 lo = 0, hi = 0, len = 0, at = 0;
    A acc = identity;
    if (s >= 0) {
        const i64 row = b / a.blocks_per_row;
        const i64 bj = b - row * a.blocks_per_row;
        const i64 begin = off(s), end = off(s + 1);
        const i64 last = (end - 1) / ((i64)TILE * a.tiles_per_block);  // the run holding the segment's last element
        // The heads of runs b + 1 .. b + last - bj, by their index over all rows.
        lo = b + 1;
        hi = b + 1 + (last - bj);
        len = end - begin;
        at = row * a.m + s;
        acc = tail[b];
        if (hi - lo <= SHORT) {
#pragma unroll
            for (int q = 0; q < SHORT; ++q)
                if (lo + q < hi) acc = OP::combine(acc, head[lo + q]);
            out[at] = finish<O, MEAN>(acc, len);
        }
    }
    for (unsigned spans = __ballot_sync(0xffffffffu, s >= 0 && hi - lo > SHORT); spans; spans &= spans - 1) {
        const int src = __ffs(spans) - 1;
        const i64 l = __shfl_sync(0xffffffffu, lo, src), h = __shfl_sync(0xffffffffu, hi, src);
        // Whole groups of runs inside the segment: in [l, h - 1), before the run holding
        // its last element.
        const i64 g0 = (l + G - 1) / G, g1 = (h - 1) / G;
        A part;
        if (G > 1 && g1 > g0) {
            part = OP::combine(warp_range<A, O, OP>(head, l, g0 * G, lane),
                               warp_range<A, O, OP>(group_head, g0, g1, lane));
            part = OP::combine(part, warp_range<A, O, OP>(head, g1 * G, h, lane));
        } else {
            part = warp_range<A, O, OP>(head, l, h, lane);
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) part = OP::combine(part, shfl_xor(part, o));
        if (lane == src) out[at] = finish<O, MEAN>(OP::combine(acc, part), len);
    }
}
