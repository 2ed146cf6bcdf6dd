// ids: segment ids into offsets on the device (ids_to_offsets), their rules tested on the way.
//
// linred_ids_to_offsets32 / linred_ids_to_offsets64: for n ids and ns segments, padded[0] = 0,
// padded[k + 1] = the first i with ids[i] >= k (ids_lower_bound, a binary search; n where there is none) for
// 0 <= k <= ns, and padded[ns + 2] = n: for sorted ids, the offsets of segments 0 .. ns - 1
// framed by two sentinel segments, the ids below 0 before them and those of ns or more after.
// Every value lies in [0, n] whatever the ids (a search over unsorted ones stays in bounds),
// so a reduction that reads them never leaves the data.  Where bad is not null (a word of pinned
// host memory the caller cleared), a thread that finds an id outside [0, ns) stores 1 into its
// first byte, one that finds an id smaller than the one before it 1 into its second (the word
// reads 1, 256 or 257: every writer of a byte stores the same value, so racing writers lose
// neither rule).  Grid-stride over max(n, ns + 3) indices, each
// thread reading ids[i] and its left neighbour (which the neighbouring thread has just loaded);
// indices are 64-bit.

#pragma once

#include "common.cuh"

// The first i in [0, n) with ids[i] >= k, or n (over sorted ids; in [0, n] over any).
template <class I>
__device__ __forceinline__ i64 ids_lower_bound(const I* __restrict__ ids, i64 n, i64 k) {
    i64 lo = 0, hi = n;
    while (lo < hi) {
        const i64 mid = lo + ((hi - lo) >> 1);
        if ((i64)ids[mid] < k) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

template <class I>
__device__ __forceinline__ void ids_to_offsets(const I* __restrict__ ids, i64 n, i64 ns, i64* __restrict__ padded,
                                               int* bad) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 count = n > ns + 3 ? n : ns + 3;
    int flags = 0;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        if (i < n) {
            const i64 v = (i64)ids[i];
            if (v < 0 || v >= ns) flags |= 1;
            if (i > 0 && v < (i64)ids[i - 1]) flags |= 2;
        }
        if (i == 0) {
            padded[0] = 0;
        } else if (i <= ns + 1) {
            padded[i] = ids_lower_bound(ids, n, i - 1);
        } else if (i == ns + 2) {
            padded[i] = n;
        }
    }
    // (plain stores, as checks.cuh's: atomics on pinned host memory are not guaranteed; a byte a
    // rule, each written only with 1)
    if (bad) {
        volatile unsigned char* rules = (volatile unsigned char*)bad;
        if (flags & 1) rules[0] = 1;
        if (flags & 2) rules[1] = 1;
    }
}

extern "C" __global__ void linred_ids_to_offsets32(const int* ids, i64 n, i64 ns, i64* padded, int* bad) {
    ids_to_offsets<int>(ids, n, ns, padded, bad);
}

extern "C" __global__ void linred_ids_to_offsets64(const i64* ids, i64 n, i64 ns, i64* padded, int* bad) {
    ids_to_offsets<i64>(ids, n, ns, padded, bad);
}
