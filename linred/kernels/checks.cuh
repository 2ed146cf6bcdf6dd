// checks: the rules of offsets, tested on the device in one pass over them (check_offsets).
//
// linred_check_offsets32 / linred_check_offsets64: offsets[0] == 0, offsets[i] >= offsets[i - 1]
// for 0 < i <= m, and offsets[m] == n.  A thread that finds a rule broken writes 1 to *bad,
// which the caller set to 0 before the launch and reads after it (a word of pinned host
// memory: no copy back, one stream synchronization).  Which rule broke, and where, the caller
// finds out afterwards on the error path only, so the message can name the values.
//
// Grid-stride over i in [0, m]; each thread reads offsets[i] and its left neighbour, which
// the neighbouring thread has just loaded (L1), so the offsets cross memory once.  Indices
// are 64-bit: more than 2^31 offsets are tested like any others.

#pragma once

#include "common.cuh"

template <class I>
__device__ __forceinline__ void check_offsets(const I* __restrict__ offsets, i64 m, i64 n, int* bad) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    bool ok = true;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i <= m; i += stride) {
        const i64 v = (i64)offsets[i];
        ok &= i == 0 ? v == 0 : v >= (i64)offsets[i - 1];
        ok &= i != m || v == n;
    }
    if (!ok) *bad = 1;  // every writer writes the same value
}

extern "C" __global__ void linred_check_offsets32(const int* offsets, i64 m, i64 n, int* bad) {
    check_offsets<int>(offsets, m, n, bad);
}

extern "C" __global__ void linred_check_offsets64(const i64* offsets, i64 m, i64 n, int* bad) {
    check_offsets<i64>(offsets, m, n, bad);
}
