// tile_fixup: the segments that span the runs of tile_reduce or warp_reduce.
//
// Holds:
//  - tile_fixup: one thread per run whose last segment continues into later runs
//    sums that segment's partials in a fixed order (deterministic) and writes the
//    result;
//  - warp_range: a warp adds a range of partials, a fixed order;
//  - load: a partial read plainly, or past the non-coherent caches (COHERENT);
//  - with CHECKED (after warp_reduce's checked variant), the test that every run's walk of
//    the offsets ends where the next run's begins (see warp.cuh);
//  - last_block_fixup: tile_fixup done by the last block of the reduction kernel itself (one
//    launch, for small grids);
//  - its entry point: LINRED_FIXUP (linred_fixup).

#pragma once

#include "offsets.cuh"

// A partial written by other blocks of the same launch (COHERENT: last_block_fixup) is read
// past the non-coherent caches, as fixed_long reads its partials.
template <bool COHERENT, class V> __device__ __forceinline__ V load(const V* p) {
    if constexpr (COHERENT) return *(const volatile V*)p;
    else return *p;
}

// Adds h[lo], ..., h[hi - 1] across the warp's lanes, four loads in flight per lane
// (a fixed order: deterministic); every lane gets its own part.
template <class A, class O, class OP, bool COHERENT = false>
__device__ __forceinline__ A warp_range(const A* __restrict__ h, i64 lo, i64 hi, int lane) {
    A acc0 = OP::template identity<O, A>(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    i64 k = lo + lane;
    for (; k + 96 < hi; k += 128) {
        acc0 = OP::combine(acc0, load<COHERENT>(h + k));
        acc1 = OP::combine(acc1, load<COHERENT>(h + k + 32));
        acc2 = OP::combine(acc2, load<COHERENT>(h + k + 64));
        acc3 = OP::combine(acc3, load<COHERENT>(h + k + 96));
    }
    for (; k < hi; k += 32) acc0 = OP::combine(acc0, load<COHERENT>(h + k));
    return OP::combine(OP::combine(acc0, acc1), OP::combine(acc2, acc3));
}

// One thread per run b (a block of tile_reduce, a warp's run of warp_reduce) whose
// last segment continues into later runs: it is completed from the head pieces of
// the runs it covers, summed in a fixed order (deterministic).  A thread adds up to
// SHORT heads itself, with their loads in flight together; longer spans are taken
// by the whole warp, one at a time.  With G > 1, group_head[g] holds the sum of
// head[g * G .. g * G + G - 1], valid where those runs lie inside one segment,
// which is where it is read: a segment spanning thousands of runs reads G times
// fewer partials.  Run b is the caller's (b's of a warp are consecutive, and every lane of
// the warp calls); COHERENT: the partials were written by other blocks of this launch.
template <class T, class A, class O, class OP, bool MEAN, int TILE, int G, bool CHECKED, bool COHERENT = false,
          class Off>
__device__ __forceinline__ void tile_fixup(i64 b, O* __restrict__ out, Off off, TileArgs a,
                                           const A* __restrict__ head, const A* __restrict__ tail,
                                           const i64* __restrict__ tail_seg, const A* __restrict__ group_head,
                                           const i64* __restrict__ walks, int* __restrict__ bad) {
    constexpr int SHORT = 4;
    const int lane = threadIdx.x & 31;
    // Run b's walk of the offsets must end where run b + 1's begins (the row's last: checked
    // by its warp).
    if (CHECKED && b + 1 < a.num_blocks && (b + 1) % a.blocks_per_row != 0 &&
        load<COHERENT>(walks + 2 * b + 1) != load<COHERENT>(walks + 2 * b + 2))
        *bad = 1;  // every writer writes the same value
    const A identity = OP::template identity<O, A>();
    i64 s = b < a.num_blocks ? load<COHERENT>(tail_seg + b) : -1;
    if (CHECKED && s >= a.m) s = -1;  // (checked runs carry segments below m; this bounds out[] anyway)
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
        // (Checked offsets keep end <= n, so hi stays in the row; the row's end bounds it anyway.)
        if (CHECKED) hi = min(hi, b + 1 + (a.blocks_per_row - 1 - bj));
        len = end - begin;
        at = tile_out_start(a, row) + s * tile_out_stride(a);
        acc = load<COHERENT>(tail + b);
        if (hi - lo <= SHORT) {
#pragma unroll
            for (int q = 0; q < SHORT; ++q)
                if (lo + q < hi) acc = OP::combine(acc, load<COHERENT>(head + lo + q));
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
            part = OP::combine(warp_range<A, O, OP, COHERENT>(head, l, g0 * G, lane),
                               warp_range<A, O, OP, COHERENT>(group_head, g0, g1, lane));
            part = OP::combine(part, warp_range<A, O, OP, COHERENT>(head, g1 * G, h, lane));
        } else {
            part = warp_range<A, O, OP, COHERENT>(head, l, h, lane);
        }
        part = warp_all<A, OP>(part);
        if (lane == src) out[at] = finish<O, MEAN>(OP::combine(acc, part), len);
    }
}

// tile_fixup for every run, by the block of the reduction kernel that finishes last (a
// ticket counts the blocks; the last sets it back to zero for the next launch): the fix-up
// without a launch of its own, for grids whose runs a block goes through in a few passes.
// Every thread of every block calls it after the reduction (its partials written).
template <class T, class A, class O, class OP, bool MEAN, int THREADS, int TILE, int G, bool CHECKED, class Off>
__device__ __forceinline__ void last_block_fixup(O* __restrict__ out, Off off, TileArgs a, const A* head,
                                                 const A* tail, const i64* tail_seg, const A* group_head,
                                                 const i64* walks, int* bad, unsigned* __restrict__ ticket) {
    __shared__ bool last;
    __threadfence();  // this thread's partials are visible before the ticket counts its block
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;  // (uniform across the block)
    __threadfence();
    for (i64 base = 0; base < a.num_blocks; base += THREADS)
        tile_fixup<T, A, O, OP, MEAN, TILE, G, CHECKED, true>(base + threadIdx.x, out, off, a, head, tail, tail_seg,
                                                              group_head, walks, bad);
    if (threadIdx.x == 0) *ticket = 0u;
}

// ---- entry points -----------------------------------------------------------------
// linred_fixup: tile_fixup for runs of tiles of TILE elements, heads joined G runs at a time;
// CHECKED: the runs' walks tested into *bad (the other variant ignores walks and bad).
#define LINRED_FIXUP(T, A, O, OP, MEAN, THREADS, TILE, G, I, OFFSETS, CHECKED)                                 \
    extern "C" __global__ void __launch_bounds__(THREADS) linred_fixup(                                        \
        O* out, LINRED_TILE_PARAMS(I), const A* head, const A* tail, const long long* ts, const A* gh,         \
        const long long* walks, int* bad) {                                                                    \
        LINRED_TILE_ARGS                                                                                       \
        tile_fixup<T, A, O, OP, MEAN, TILE, G, CHECKED>((i64)blockIdx.x * blockDim.x + threadIdx.x, out, OFFSETS, a, \
                                                        head, tail, ts, gh, walks, bad);                       \
    }
