// scan: lengths into offsets in one pass over them (lengths_to_offsets), on the device.
//
// linred_lengths_to_offsets32 / linred_lengths_to_offsets64: offsets[0] = 0 and offsets[i + 1] =
// lengths[0] + ... + lengths[i] for i < m, in 64-bit two's complement (a sum past the int64 range
// wraps, as a cumulative sum of the array libraries does: the offsets' check then finds them
// decreasing).  One read of the lengths and one write of the offsets, where a library's cumulative
// sum into a slice of a larger array reads and writes them two or three times.
//
// A decoupled look-back scan: block t takes tile t (SCAN_TILE lengths), sums it, publishes the
// sum (flag 1) and, once it has the sum of every tile before it, its inclusive prefix (flag 2);
// its first warp finds that sum by looking back over the tiles before it, 32 at a time (a lane a
// tile), adding the published values up to the nearest tile with a prefix.  (One thread walking
// back a tile at a time took 300 us for 4,096 tiles on an H200: a tile's predecessors in flight
// have only their sums, and each step is a round trip to L2.)  A tile waits only for tiles of lower index, which the hardware
// started no later than it (blocks are dispatched in index order; CUB's single-pass scans rely on
// the same), so the wait ends.  The flags must be 0 before the launch (the caller clears them:
// they are per call, so two scans on two streams never share them).  A value is written before
// its flag, with a fence between; a reader reads the flag, fences, then the value, both volatile
// (no stale L1 line).
//
// Loads and stores are striped (thread j takes elements j, j + SCAN_THREADS, ...: coalesced) and
// transposed through shared memory to blocked (thread j scans elements 16 j .. 16 j + 15), with
// one padding element every 16 (scan_slot: a tile element's slot) so that the blocked reads of
// 8-byte values are free of bank conflicts.  Indices are 64-bit.

#pragma once

#include "common.cuh"

#define SCAN_THREADS 256
#define SCAN_ITEMS 16
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

// The shared-memory slot of a tile's element j (one padding element after every 16).
__device__ __forceinline__ int scan_slot(int j) { return j + (j >> 4); }

template <class I>
__device__ __forceinline__ void lengths_to_offsets(const I* __restrict__ lengths, i64 m, u64* __restrict__ offsets,
                                                   u64* sums, u64* prefixes, unsigned* flags) {
    __shared__ u64 items[SCAN_TILE + SCAN_TILE / 16];
    __shared__ u64 warp_sums[SCAN_THREADS / 32];
    __shared__ u64 tile_prefix;
    const i64 t = blockIdx.x;
    const i64 base = t * SCAN_TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const int j = k * SCAN_THREADS + tid;
        const i64 i = base + j;
        items[scan_slot(j)] = i < m ? (u64)(i64)lengths[i] : 0;  // (sign-extended, then modulo 2^64)
    }
    __syncthreads();
    u64 v[SCAN_ITEMS];
    u64 s = 0;
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        s += items[tid * (SCAN_ITEMS + 1) + k];  // (scan_slot(tid * SCAN_ITEMS + k))
        v[k] = s;
    }
    // The lanes' inclusive scan of the threads' sums, then the warps' sums.
    u64 x = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();  // (every thread has read its items: the buffer is free for the results)
    if (warp == 0) {
        u64 w = lane < SCAN_THREADS / 32 ? warp_sums[lane] : 0;
#pragma unroll
        for (int o = 1; o < SCAN_THREADS / 32; o <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < SCAN_THREADS / 32) warp_sums[lane] = w;  // inclusive
        const u64 total = __shfl_sync(0xffffffffu, w, SCAN_THREADS / 32 - 1);  // the tile's sum
        volatile u64* vsums = sums;
        volatile u64* vprefixes = prefixes;
        volatile unsigned* vflags = flags;
        u64 before = 0;
        if (t > 0) {
            if (lane == 0) {
                vsums[t] = total;
                __threadfence();
                vflags[t] = 1;
            }
            // The warp looks back 32 tiles at a time, lane l at tile end - 1 - l: it adds the
            // published values up to the nearest tile with a prefix (tile 0 always has one), or
            // all 32 sums and looks further back.
            for (i64 end = t;; end -= 32) {
                const i64 p = end - 1 - lane;
                unsigned f = 0;
                u64 value = 0;
                if (p >= 0) {
                    do {
                        f = vflags[p];
                    } while (f == 0);
                    __threadfence();
                    value = f == 2 ? vprefixes[p] : vsums[p];
                }
                const unsigned with_prefix = __ballot_sync(0xffffffffu, f == 2);
                // (no prefix among the 32: every lane's tile exists, since tile 0 has one)
                const int nearest = with_prefix ? __ffs(with_prefix) - 1 : 31;
                u64 add = lane <= nearest ? value : 0;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) add += __shfl_xor_sync(0xffffffffu, add, o);
                before += add;
                if (with_prefix) break;
            }
        }
        if (lane == 0) {
            vprefixes[t] = before + total;
            __threadfence();
            vflags[t] = 2;
            tile_prefix = before;
        }
    }
    __syncthreads();
    const u64 prefix = tile_prefix + (warp > 0 ? warp_sums[warp - 1] : 0) + (x - s);
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) items[tid * (SCAN_ITEMS + 1) + k] = prefix + v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        const int j = k * SCAN_THREADS + tid;
        const i64 i = base + j;
        if (i < m) offsets[i + 1] = items[scan_slot(j)];
    }
    if (t == 0 && tid == 0) offsets[0] = 0;
}

extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
    linred_lengths_to_offsets32(const int* lengths, i64 m, u64* offsets, u64* sums, u64* prefixes, unsigned* flags) {
    lengths_to_offsets<int>(lengths, m, offsets, sums, prefixes, flags);
}

extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
    linred_lengths_to_offsets64(const i64* lengths, i64 m, u64* offsets, u64* sums, u64* prefixes, unsigned* flags) {
    lengths_to_offsets<i64>(lengths, m, offsets, sums, prefixes, flags);
}
