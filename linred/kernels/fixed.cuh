// The fixed-length kernels: one launch that reads only the data's and the result's
// device pointers.
//
// Holds:
//  - fixed_small: fixed-length segments whose length L is a power of two no
//    longer than 32 vectors.  Each thread loads 16-byte vectors; a segment lies
//    inside one vector (L <= VEC) or across L / VEC neighbouring lanes, reduced
//    with warp shuffles.  No shared memory, no offsets.
//  - fixed_rows: longer power-of-two lengths, up to 32 * UNROLL vectors: a warp
//    streams a contiguous run of rows and reduces R rows per segment.
//  - fixed_staged: short lengths that are not powers of two: tiles of whole segments
//    staged in shared memory, one thread per segment.
//  - fixed_long: long fixed lengths of whole vectors: blocks reduce chunks of a
//    segment, and the last block of a segment adds their partials in order.
//  - their entry points: LINRED_FIXED (linred_fixed: fixed_small or fixed_rows),
//    LINRED_STAGED (linred_staged) and LINRED_LONG (linred_long).

#pragma once

#include "common.cuh"

// ---- fixed_small --------------------------------------------------------------
// R consecutive results of one thread, stored as whole 4-, 8- or 16-byte words where they fill
// some and out is aligned to them, else one by one.  Storing the VEC / L results of a short
// length one by one made every lane's stores land 16 bytes apart: float16 and bfloat16 at L = 1
// ran at a quarter of copy bandwidth on an H100.
template <class O, int R> struct Results {
    static constexpr int BYTES = R * (int)sizeof(O);
    static constexpr int WORD = BYTES % 16 == 0 ? 16 : BYTES % 8 == 0 ? 8 : BYTES % 4 == 0 ? 4 : 0;
    struct __align__(WORD > 0 ? WORD : alignof(O)) Store { O v[R]; };
    O v[R];
    static __device__ __forceinline__ bool aligned(const O* out) {
        return WORD > 0 && reinterpret_cast<unsigned long long>(out) % (WORD > 0 ? WORD : 1) == 0;
    }
    __device__ __forceinline__ void store(O* o, bool out_aligned) const {
        if constexpr (WORD > 0) {
            if (out_aligned) {  // o = out + a multiple of R: aligned to WORD with out
                Store w;
#pragma unroll
                for (int k = 0; k < R; ++k) w.v[k] = v[k];
                *reinterpret_cast<Store*>(o) = w;
                return;
            }
        }
#pragma unroll
        for (int k = 0; k < R; ++k) o[k] = v[k];
    }
};

// x: N elements (N a multiple of L and of VEC), 16-byte aligned.  out: N / L results.
// Grid-stride over chunks of THREADS * UNROLL vectors.
template <class T, class A, class O, class OP, int L, bool MEAN, int THREADS, int UNROLL>
__device__ __forceinline__ void fixed_small(const T* __restrict__ x, O* __restrict__ out, i64 nvec) {
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    const V* xv = reinterpret_cast<const V*>(x);
    const i64 chunk = (i64)THREADS * UNROLL;
    // Whether a thread's results (L <= VEC: VEC / L of them, next to those of the neighbouring
    // lanes) may be stored as one vector: out is aligned to their size (an out= view need not be).
    const bool out_aligned = Results<O, (L <= VEC ? VEC / L : 1)>::aligned(out);
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
                    constexpr int R = VEC / L;  // results per vector
                    Results<O, R> res;
#pragma unroll
                    for (int k = 0; k < R; ++k) {
                        A acc = to_acc<A>(buf[u].v[k * L]);
#pragma unroll
                        for (int i = 1; i < L; ++i) acc = OP::combine(acc, to_acc<A>(buf[u].v[k * L + i]));
                        res.v[k] = finish<O, MEAN>(acc, L);
                    }
                    res.store(out + v * R, out_aligned);
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

// ---- fixed_staged -----------------------------------------------------------------
// Short fixed lengths that are not powers of two (a segment of at most 256 bytes) on
// contiguous, 16-byte aligned data: a block stages a tile of S = THREADS * SPT whole
// segments (S * L elements, a multiple of 16 bytes) in shared memory with coalesced 16-byte
// loads, then thread t reduces segments t, t + THREADS, ... of the tile from shared memory
// and stores their results (each round's stores are consecutive).  A segment never crosses
// a tile, so there are no partials; the last tile, shorter, is loaded element by element.
// SPT > 1 for the shortest segments keeps a tile near 16 KiB, so each block has enough
// bytes in flight per barrier.  Grid-stride over tiles.  (warp_reduce serves these lengths
// too, but marks and scans every segment: float16 at L = 3 ran at 37% of copy there on an
// H100.)
template <class T, class A, class O, class OP, int L, bool MEAN, int THREADS, int SPT>
__device__ __forceinline__ void fixed_staged(const T* __restrict__ x, O* __restrict__ out, i64 m) {
    typedef typename VecOf<T>::type V;
    constexpr int VEC = VecOf<T>::N;
    constexpr int S = THREADS * SPT;  // segments per tile
    constexpr int E = S * L;          // elements per tile
    static_assert(E % VEC == 0, "a tile must be whole 16-byte vectors");
    constexpr int EV = E / VEC;
    constexpr int PER = (EV + THREADS - 1) / THREADS;  // vectors each thread loads
    extern __shared__ __align__(16) unsigned char staged_shared[];
    T* tile = reinterpret_cast<T*>(staged_shared);
    V* tile_v = reinterpret_cast<V*>(staged_shared);
    for (i64 t = blockIdx.x; t * S < m; t += gridDim.x) {
        const i64 first = t * S;
        const int count = (int)min((i64)S, m - first);  // segments in this tile
        const T* src = x + first * L;
        if (count == S) {
            const V* sv = reinterpret_cast<const V*>(src);
            V buf[PER];
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const int i = k * THREADS + threadIdx.x;
                if (i < EV) buf[k] = sv[i];
            }
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                const int i = k * THREADS + threadIdx.x;
                if (i < EV) tile_v[i] = buf[k];
            }
        } else {
            for (int i = threadIdx.x; i < count * L; i += THREADS) tile[i] = src[i];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SPT; ++j) {
            const int seg = j * THREADS + (int)threadIdx.x;
            if (seg < count) {
                const T* p = tile + seg * L;
                A acc = to_acc<A>(p[0]);
#pragma unroll
                for (int i = 1; i < L; ++i) acc = OP::combine(acc, to_acc<A>(p[i]));
                out[first + seg] = finish<O, MEAN>(acc, L);
            }
        }
        __syncthreads();  // the tile is read before the next one overwrites it
    }
}

// ---- fixed_long -------------------------------------------------------------------
// Long fixed lengths of whole vectors (L = LV * VEC): segment s is cut into chunks of
// THREADS * UNROLL vectors, one block per chunk.  A segment of one chunk is written by
// its block; otherwise each block leaves its partial, and the block that finishes a
// segment's chunks last (a per-segment ticket) adds the partials in chunk order and
// writes the result: one launch, the same bits every run.  The last block sets the
// ticket back to zero for the next call.
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

// ---- entry points -----------------------------------------------------------------
// linred_fixed: KERNEL (fixed_small or fixed_rows) over nvec 16-byte vectors.
#define LINRED_FIXED(KERNEL, T, A, O, OP, LEN, MEAN, THREADS, UNROLL)                                         \
    extern "C" __global__ void __launch_bounds__(THREADS) linred_fixed(const T* x, O* out, long long nvec) { \
        KERNEL<T, A, O, OP, LEN, MEAN, THREADS, UNROLL>(x, out, nvec);                                        \
    }

// linred_long: fixed_long over m segments of lv vectors, chunks blocks per segment.
#define LINRED_STAGED(T, A, O, OP, LEN, MEAN, THREADS, SPT)                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) linred_staged(const T* x, O* out, long long m) {    \
        fixed_staged<T, A, O, OP, LEN, MEAN, THREADS, SPT>(x, out, m);                                        \
    }

#define LINRED_LONG(T, A, O, OP, MEAN, THREADS, UNROLL)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        linred_long(const T* x, O* out, A* partials, unsigned* tickets, long long lv, long long chunks,        \
                    long long m) {                                                                             \
        fixed_long<T, A, O, OP, MEAN, THREADS, UNROLL>(x, out, partials, tickets, lv, chunks, m);              \
    }
