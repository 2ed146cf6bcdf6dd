// gather: the rows of a C-contiguous array copied in a given order, as the data of unsorted segment
// ids is gathered into the ids' sorted order before its reduction (any backend).
//
// gather_rows, behind linred_gather_rows{16,8,4,2,1}: out's row i = x's row order[i], for n rows
// of `words` words of 16, 8, 4, 2 or 1 bytes (the widest word that divides the rows' bytes and
// both arrays' addresses): thread w copies word w of out (coalesced stores; each row's words read
// together).  Every order[i] must lie in [0, rows of x) (a stable sort's positions).  Grid-stride
// over n * words words; indices are 64-bit.  (torch's index_select of 4M rows of 16 float32 took
// 2.4 ms on an H200, about a tenth of the bandwidth a copy has.)

#pragma once

#include "common.cuh"

template <class W>
__device__ __forceinline__ void gather_rows(const W* __restrict__ x, const i64* __restrict__ order,
                                            W* __restrict__ out, i64 n, i64 words) {
    const i64 total = n * words;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 w = (i64)blockIdx.x * blockDim.x + threadIdx.x; w < total; w += stride) {
        const i64 row = w / words;
        out[w] = x[order[row] * words + (w - row * words)];
    }
}

struct __align__(16) Words16 {
    unsigned long long a, b;
};

extern "C" __global__ void linred_gather_rows16(const Words16* x, const i64* order, Words16* out, i64 n, i64 words) {
    gather_rows<Words16>(x, order, out, n, words);
}
extern "C" __global__ void linred_gather_rows8(const unsigned long long* x, const i64* order, unsigned long long* out,
                                               i64 n, i64 words) {
    gather_rows<unsigned long long>(x, order, out, n, words);
}
extern "C" __global__ void linred_gather_rows4(const unsigned int* x, const i64* order, unsigned int* out, i64 n,
                                               i64 words) {
    gather_rows<unsigned int>(x, order, out, n, words);
}
extern "C" __global__ void linred_gather_rows2(const unsigned short* x, const i64* order, unsigned short* out, i64 n,
                                               i64 words) {
    gather_rows<unsigned short>(x, order, out, n, words);
}
extern "C" __global__ void linred_gather_rows1(const unsigned char* x, const i64* order, unsigned char* out, i64 n,
                                               i64 words) {
    gather_rows<unsigned char>(x, order, out, n, words);
}
