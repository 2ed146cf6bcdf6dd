// Segment boundaries and the tiling of rows, shared by tile_reduce, warp_reduce,
// tile_fixup, features_reduce, softmax_from_parts and grad_from_parts.
//
// Holds: ArrayOffsets and FixedOffsets (offsets[s] from an array, or s * L), ShiftedOffsets (either,
// SHIFT elements further),
// checked_bounds (a segment's bounds checked by the kernel that reads them),
// segment_of_row and segment_from (the segment a row lies in; gallop_forward and last_at_most,
// their steps), segment_chunks (a walk over chunks of rows, each value with its segment's
// parameters), segment_at_or_after and warp_segment_at_or_after (the first segment at or after
// an element), TileArgs (a row's tiling) and where a row's data and results lie (tile_row_start,
// tile_out_start, tile_out_stride), the carry modes, and the parameter list and TileArgs
// construction every tile kernel's entry point shares (LINRED_TILE_PARAMS, LINRED_TILE_ARGS).

#pragma once

#include "common.cuh"

// Segment boundaries: offsets[s] from an array, or s * L for a fixed length.
template <class I> struct ArrayOffsets {
    static constexpr i64 origin = 0;  // where segment 0 must begin (checked offsets)
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
    static constexpr i64 origin = 0;
    i64 L;
    __device__ __forceinline__ i64 operator()(i64 s) const { return s * L; }
    __device__ __forceinline__ void prefetch(i64, int, i64) const {}
};
// Boundaries SHIFT elements further (warp_reduce on rows that begin SHIFT elements past a
// 16-byte boundary, read from that boundary: the SHIFT elements before each row belong to no
// segment).  Made by shifted(), whose parentheses keep a macro argument whole.
template <class Off, int SHIFT> struct ShiftedOffsets {
    static constexpr i64 origin = Off::origin + SHIFT;
    Off inner;
    __device__ __forceinline__ i64 operator()(i64 s) const { return inner(s) + SHIFT; }
    __device__ __forceinline__ void prefetch(i64 s, int lane, i64 expect) const { inner.prefetch(s, lane, expect); }
};
template <int SHIFT, class Off> __device__ __forceinline__ ShiftedOffsets<Off, SHIFT> shifted(Off off) {
    return ShiftedOffsets<Off, SHIFT>{off};
}

// Offsets checked by the kernel that reads them (check=True without a pass of its own):
// segment s's bounds, read from the offsets, must lie in [0, n], not decrease, start at 0
// for the first segment and end at n for the last.  A segment that breaks a rule sets *bad
// (a word of pinned host memory the host reads after the call) and is read as empty, so no
// load leaves [0, n).  A kernel that reads every segment's bounds this way (m >= 1) tests
// every rule linred_check_offsets tests: each pair offsets[s], offsets[s + 1] is a
// segment's.  bad == nullptr: the offsets were checked before (or not to be).
__device__ __forceinline__ void checked_bounds(i64 s, i64 m, i64 n, int* bad, i64& begin, i64& end) {
    if (bad != nullptr &&
        !(0 <= begin && begin <= end && end <= n && (s != 0 || begin == 0) && (s != m - 1 || end == n))) {
        *bad = 1;  // every writer writes the same value
        begin = end = 0;
    }
}

// From lo (off(lo) <= v), steps of 1, 2, 4, ... forward while the offset there is at most v:
// [lo, hi] then brackets the last s with off(s) <= v (hi: m, or one before the first offset past v).
template <class Off> __device__ __forceinline__ void gallop_forward(Off off, i64 m, i64 v, i64& lo, i64& hi) {
    i64 step = 1;
    hi = m;
    while (lo + step <= m) {
        if (off(lo + step) > v) {
            hi = lo + step - 1;
            break;
        }
        lo += step;
        step *= 2;
    }
}

// The last s in [lo, hi] with off(s) <= v, the bracket halved.
template <class Off> __device__ __forceinline__ i64 last_at_most(Off off, i64 lo, i64 hi, i64 v) {
    while (lo < hi) {
        const i64 mid = lo + (hi - lo + 1) / 2;
        if (off(mid) <= v) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The last s in [0, m] with off(s) <= v (0 <= v < n): the segment that row v lies in.  The
// search starts where v's share of the rows puts it (right, or one off, for even lengths) and
// gallops from there, then halves the bracket: a few dependent loads where lengths are even,
// about 2 log2 of the distance otherwise (a binary search over 10^4 segments: 14).  It ends for
// any offsets (each step shrinks the bracket); the caller checks what it returns.
template <class Off> __device__ __forceinline__ i64 segment_of_row(Off off, i64 m, i64 n, i64 v) {
    const i64 guess = min((i64)((double)v / (double)n * (double)m), m);
    i64 lo, hi, step = 1;
    if (off(guess) <= v) {  // the answer is guess or after it
        lo = guess;
        gallop_forward(off, m, v, lo, hi);
    } else {  // before it
        hi = guess - 1;
        lo = 0;
        while (hi - step + 1 > 0) {
            const i64 c = hi - step + 1;
            if (off(c) <= v) {
                lo = c;
                break;
            }
            hi = c - 1;
            step *= 2;
        }
    }
    return last_at_most(off, lo, hi, v);
}

// The same from segment s0 on (off(s0) <= v < n): the last s in [s0, m] with off(s) <= v, a few
// loads where v lies in s0 or a segment soon after it (segment_chunks).
template <class Off> __device__ __forceinline__ i64 segment_from(Off off, i64 m, i64 s0, i64 v) {
    i64 lo = s0, hi;
    gallop_forward(off, m, v, lo, hi);
    return last_at_most(off, lo, hi, v);
}

// segment_chunks: a grid's walk over `rows` rows of n values of one feature, each value given its
// segment's parameters (softmax_from_parts, lse.cuh; grad_from_parts, softmax_grad.cuh).  Each
// block takes consecutive chunks of THREADS * ITEMS values of a row, a thread every THREADS-th
// value of a chunk.  The block's first thread finds the segments of the chunk's first and last
// values (segment_of_row for the block's first chunk, segment_from after it: a load or two where
// segments are long); where they are one, it makes that segment's parameters (body.part(r, s), a
// Body::P) for the whole block, and every thread reads no offsets and issues all its loads
// (body.load(r, i), a Body::V) before the first write (body.write(r, i, p, v)); else a thread
// finds its values' segments from the first, again only past the end of the one it holds.  (A
// search per value, or per thread and chunk, made the kernel wait on the offsets' loads: 64M
// float32 values in segments of 4,096 rows took 250-330 us beside a copy's 128.)  Segments are
// bounded to [0, segments): with offsets that break the rules nothing is read or written out of
// bounds.  P is trivially constructible (it lives in shared memory); V is default-constructible:
// a value past the row's end is V() (assigned on a condition, ptxas kept the loads apart and
// used 40 registers, or spilled).
template <int THREADS, int ITEMS, class Off, class Body>
__device__ __forceinline__ void segment_chunks(Off off, i64 rows, i64 n, i64 segments, const Body& body) {
    typedef typename Body::P P;
    typedef typename Body::V V;
    constexpr i64 CHUNK = (i64)THREADS * ITEMS;
    const i64 per_row = (n + CHUNK - 1) / CHUNK, total = rows * per_row;
    const i64 per_block = (total + gridDim.x - 1) / gridDim.x;
    const i64 c0 = blockIdx.x * per_block, c1 = min(c0 + per_block, total);
    __shared__ i64 span[2];  // the segments of the chunk's first and last values
    __shared__ P one;        // their parameters, where they are one
    i64 last = -1;           // (thread 0: the previous chunk's last segment, in this row)
    for (i64 item = c0; item < c1; ++item) {
        const i64 r = item / per_row;
        const i64 base = (item - r * per_row) * CHUNK;
        if (threadIdx.x == 0) {
            if (base == 0) last = -1;  // (a new row of the batch)
            const i64 lo = min(last < 0 ? segment_of_row(off, segments, n, base) : segment_from(off, segments, last, base),
                               segments - 1);
            const i64 hi = min(segment_from(off, segments, lo, min(base + CHUNK, n) - 1), segments - 1);
            span[0] = lo;
            span[1] = last = hi;
            if (lo == hi) one = body.part(r, lo);
        }
        __syncthreads();
        if (span[0] == span[1]) {  // every load of the chunk out before the first is used
            const P p = one;
            V v[ITEMS];
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                const i64 i = base + threadIdx.x + (i64)k * THREADS;
                v[k] = i < n ? body.load(r, i) : V();
            }
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                const i64 i = base + threadIdx.x + (i64)k * THREADS;
                if (i < n) body.write(r, i, p, v[k]);
            }
        } else {
            i64 s = span[0], end = -1;
            P p;
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                const i64 i = base + threadIdx.x + (i64)k * THREADS;
                if (i < n) {
                    if (i >= end) {  // (the first value, or past the segment's end)
                        s = min(segment_from(off, segments, s, i), segments - 1);
                        end = off(s + 1);
                        p = body.part(r, s);
                    }
                    body.write(r, i, p, body.load(r, i));
                }
            }
        }
        __syncthreads();  // (span and one are read before the next chunk's are written)
    }
}

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
template <int SHIFT>
__device__ __forceinline__ i64 warp_segment_at_or_after(const ShiftedOffsets<FixedOffsets, SHIFT>& off, i64 m, i64 v,
                                                        int) {
    return v <= SHIFT ? 0 : segment_at_or_after(off.inner, nullptr, 0, m, v - SHIFT);
}

struct TileArgs {
    i64 n;              // elements per row
    i64 m;              // segments per row
    i64 row_stride;     // elements between rows of x (between batch rows, with inner > 1)
    i64 elem_stride;    // elements between consecutive elements of a row
    i64 inner;          // rows per batch row: 1, or the feature columns of strided features
    i64 inner_stride;   // elements between those columns (with inner > 1)
    i64 tiles_per_row;
    i64 blocks_per_row; // each block reduces tiles_per_block consecutive tiles of one row
    i64 num_blocks;     // rows * blocks_per_row
    i64 tiles_per_block;
};

// Where row `row` of a tiling starts in x, and where its results go in out (a result's
// successor is tile_out_stride(a) further).  A row is a batch row (inner == 1), or with
// inner > 1 one feature column of a batch row of strided features (tile_reduce only): its
// results are that column of the batch row's (m, inner) block of out.
__device__ __forceinline__ i64 tile_row_start(const TileArgs& a, i64 row) {
    if (a.inner == 1) return row * a.row_stride;
    const i64 b = row / a.inner;
    return b * a.row_stride + (row - b * a.inner) * a.inner_stride;
}
__device__ __forceinline__ i64 tile_out_start(const TileArgs& a, i64 row) {
    if (a.inner == 1) return row * a.m;
    const i64 b = row / a.inner;
    return b * a.m * a.inner + (row - b * a.inner);
}
__device__ __forceinline__ i64 tile_out_stride(const TileArgs& a) { return a.inner; }

// The open segment a block carries from one of its tiles to the next.
enum { CARRY_NONE = 0, CARRY_FROM_BEFORE = 1, CARRY_OWN = 2 };

// The arguments every tile kernel's entry point takes (linred_tile, linred_warp, linred_fixup,
// linred_bounds), and the TileArgs they make; I is the C type of the offsets.
#define LINRED_TILE_PARAMS(I)                                                                                    \
    const I* offsets, long long L, long long n, long long m, long long rs, long long es, long long inner,          \
        long long is, long long tpr, long long bpr, long long nb, long long tpb, const long long* bounds
#define LINRED_TILE_ARGS TileArgs a{n, m, rs, es, inner, is, tpr, bpr, nb, tpb};
