// features_reduce: segments of rows of several contiguous feature columns.
//
// Holds:
//  - features_reduce: one thread per (row of the batch, segment, group of W consecutive
//    features), walking the segment's rows with UNROLL loads in flight (add_rows); with ROWS,
//    a segment of more than long_rows rows (LongArgs) is cut at multiples of ROWS: its thread
//    adds the rows before the first (its head), and one more thread per tile of ROWS rows
//    (long_tile, its segment found by segment_of_row) each tile's, into partials that the
//    last of them to finish adds up in a fixed order; with LONG_CHUNK (the LINRED_LONG_CHUNK a
//    kernel's source defines before it includes this header: calls of few long segments) a
//    chunk of 64 tiles at a time where they are more (long_piece_done, add_chain, count_piece;
//    long_head_done for a head, first_tile for where its tiles start);
//  - add_rows: a thread's rows of one feature group (every row, or every R-th for a lane of
//    features_split) added, UNROLL loads at a time, the last ones in halving steps;
//  - features_split: the same with each segment's rows dealt to R lanes whose partials a
//    fixed tree adds, by shuffles within a warp or in shared memory (segments too few to
//    fill the device otherwise, or rows too narrow for one thread to read them fast), lane 0
//    writing the sum (split_result); with ROWS, long segments cut as above;
//  - Group (W features), FeatureArgs, SumWide (float32 sums accumulated in double),
//    pow2_at_most and log2_of (the steps of features_reduce's last rows);
//  - its entry points: LINRED_FEATURES (linred_features), LINRED_FEATURES_LONG (linred_features
//    with long segments cut into tiles), LINRED_FEATURES_SPLIT (linred_features_split) and
//    LINRED_FEATURES_SPLIT_LONG (linred_features_split with long segments cut into tiles).

#pragma once

#include "offsets.cuh"

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

// The largest power of two at most n (0 for n < 1): features_reduce's first tail step.
__host__ __device__ constexpr int pow2_at_most(int n, int p = 1) {
    return n < 1 ? 0 : 2 * p > n ? p : pow2_at_most(n, 2 * p);
}
static_assert(pow2_at_most(7) == 4 && pow2_at_most(8) == 8 && pow2_at_most(1) == 1 && pow2_at_most(0) == 0, "");
// log2 of a power of two (0 for 1 and below).
__host__ __device__ constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

// acc[k] += rows i, i + step, i + 2 step, ... below end of a thread's feature group (p: its
// first feature in row 0), UNROLL loads in flight, then the last rows (fewer than UNROLL) in
// steps of TAIL, TAIL / 2, ... 1 rows (TAIL the largest power of two below UNROLL: together
// they cover UNROLL - 1 rows), each step's loads at once: a round trip to memory per step, not
// per row (UNROLL 8: a tail of 7 rows takes 3 trips, not 7; segments of 100 rows end in one
// trip of 4).  Every bound is known at compile time, so the loops unroll and buf stays in
// registers.  step is 1 for a thread that walks a segment alone (STEPPED false: known at
// compile time), R for one of features_split's R lanes.
template <class T, class A, class OP, int W, int UNROLL, bool STEPPED = false>
__device__ __forceinline__ void add_rows(A (&acc)[W], const T* __restrict__ p, i64 i, i64 end, i64 row_stride,
                                         int lanes = 1) {
    typedef typename Group<T, W>::type G;
    const int step = STEPPED ? lanes : 1;
    for (; STEPPED ? i + (UNROLL - 1) * (i64)step < end : i + UNROLL <= end; i += UNROLL * (i64)step) {
        G buf[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) buf[u] = *reinterpret_cast<const G*>(p + (i + u * step) * row_stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(buf[u].v[k]));
        }
    }
    constexpr int TAIL = pow2_at_most(UNROLL - 1), STEPS = log2_of(TAIL) + (TAIL > 0);
#pragma unroll
    for (int t = 0; t < STEPS; ++t) {
        const int h = TAIL >> t;
        if (STEPPED ? i + (h - 1) * (i64)step < end : end - i >= h) {
            G buf[TAIL > 0 ? TAIL : 1];
#pragma unroll
            for (int u = 0; u < TAIL; ++u) {
                if (u < h) buf[u] = *reinterpret_cast<const G*>(p + (i + u * step) * row_stride);
            }
#pragma unroll
            for (int u = 0; u < TAIL; ++u) {
                if (u < h) {
#pragma unroll
                    for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], to_acc<A>(buf[u].v[k]));
                }
            }
            i += h * (i64)step;
        }
    }
}

// Long segments cut into tiles of ROWS rows; ROWS = 0: none.  A segment is long when it has
// more than long_rows rows (long_rows >= ROWS).  first and partial: (row of the batch, tile,
// feature) partials: at a long segment's first tile start j0, its rows before j0 * ROWS (its
// head); at each tile j whose first row is in a long segment, the tile's rows of that
// segment.  With LONG_CHUNK, a segment of more than LONG_CHUNK tiles is added in two steps: the
// tiles of each chunk (its tiles of LONG_CHUNK consecutive ones from a multiple of LONG_CHUNK),
// whose sum goes to the partial of the chunk's first tile, then its head and chunks.  count:
// per (row of the batch, tile j0, feature group), the pieces of the segment finished in this call
// (its head and tiles, or its head and chunks); chunk_count: per (row of the batch, a chunk's
// first tile, feature group), the chunk's tiles finished.  Each is epoch << 32 | pieces: a count of another
// epoch is 0, so a call that stopped short, on bad offsets, leaves nothing behind; the replays
// of a CUDA graph share an epoch: the host zeroes the counts in every captured call, and the
// sum of the pieces sets its count back to 0 pieces.  tile_items: batch * tiles * groups.
template <class A> struct LongArgs {
    i64 long_rows;
    i64 tiles;
    i64 tile_items;
    A* __restrict__ first;
    A* __restrict__ partial;
    unsigned long long* __restrict__ count;
    unsigned long long* __restrict__ chunk_count;
    unsigned epoch;
};

// Tiles of a chunk (LongArgs), set per compiled kernel: 0 (none: one chain of every tile) or
// FEATURE_LONG_CHUNK of linred/backends/nvrtc/kernels.py, where a call's segments may have
// thousands of tiles.  (The chunks' counts and second chain cost the long kernels registers:
// 56 -> 64 for float32 data, 32.0 -> 35.6 us on 2 * 10^5 x 128 float32 rows of even lengths
// on an H200.)
#ifndef LINRED_LONG_CHUNK
#define LINRED_LONG_CHUNK 0
#endif
enum : int { LONG_CHUNK = LINRED_LONG_CHUNK };  // (an enumerator: no symbol in the PTX)

// The first tile of ROWS rows that starts at or after row b: a long segment's tiles start
// there, and its rows before them are its head.
template <int ROWS> __device__ __forceinline__ i64 first_tile(i64 b) { return b / ROWS + (b % ROWS != 0); }

// Count one more piece at c; the pieces counted so far in this call.  The count is of this
// call's epoch once its first piece is in: then one atomicAdd (a segment of many tiles would make
// a compare-and-swap loop retry once per piece that finished at the same time).  Before, the
// first piece replaces a count of another epoch by its own.  (Nothing else writes the count in
// this call before the sum of its pieces resets it.)
template <class A> __device__ __forceinline__ i64 count_piece(const LongArgs<A>& la, unsigned long long* c) {
    __threadfence();  // this piece, before the count that lets the last one read it
    unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(c);
    for (;;) {
        if ((seen >> 32) == la.epoch) return (i64)(atomicAdd(c, 1ull) & 0xffffffffull) + 1;
        const unsigned long long was = atomicCAS(c, seen, ((unsigned long long)la.epoch << 32) | 1ull);
        if (was == seen) return 1;
        seen = was;
    }
}

// acc[k] += h[pos(q) * features + k] for q = 0 ... count - 1 in order, FLIGHT of them loaded at a
// time (other SMs wrote them: read from L2); pos(q) is start + q, or with chunks the first tile
// of chunk start / LONG_CHUNK + q from start on.  FLIGHT keeps those loads' registers within what
// add_rows holds (more would cut the launch's occupancy).
template <class OP, int W, class A>
__device__ __forceinline__ void add_chain(A (&acc)[W], const A* h, i64 features, i64 start, i64 count, bool chunks) {
    constexpr int FLIGHT = W * sizeof(A) <= 32 ? 4 : W * sizeof(A) <= 64 ? 2 : 1;
    constexpr i64 CHUNK = LONG_CHUNK ? LONG_CHUNK : 1;  // (no division by 0 where there are no chunks)
    const i64 step = chunks ? CHUNK : 1, first = chunks ? start / CHUNK * CHUNK : start;
    i64 q = 0;
    for (; q + FLIGHT <= count; q += FLIGHT) {
        A b[FLIGHT][W];
#pragma unroll
        for (int u = 0; u < FLIGHT; ++u) {
            const i64 j = max(start, first + (q + u) * step);
#pragma unroll
            for (int k = 0; k < W; ++k) b[u][k] = __ldcg(h + j * features + k);
        }
#pragma unroll
        for (int u = 0; u < FLIGHT; ++u) {
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], b[u][k]);
        }
    }
    for (; q < count; ++q) {
        const i64 j = max(start, first + q * step);
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], __ldcg(h + j * features + k));
    }
}

// A piece of long segment s = [b0, b1) of batch row r, feature group g, is written: its head
// (j < 0) or its tile j.  Count it, and if it is the last of the segment's pieces (finished in
// any order), add them up in order (deterministic: the head, then tiles j0 to the last) and write
// out[r, s, g].  With LONG_CHUNK, a segment of more than LONG_CHUNK tiles is added a chunk at a
// time: a tile is counted in its chunk, whose last tile adds the chunk's tiles in order into the
// partial of its first and counts it as one of the segment's pieces; the last of those adds the
// head and the chunks in order.  (One chain of 7,813 tiles took a segment 1.1 ms.)  Without, the
// head and every tile are added in one chain.
template <class O, class OP, bool MEAN, int W, int ROWS, class A>
__device__ __forceinline__ void long_piece_done(O* __restrict__ out, const FeatureArgs& a, const LongArgs<A>& la,
                                                i64 r, i64 s, i64 g, i64 b0, i64 b1, i64 j) {
    const i64 j0 = first_tile<ROWS>(b0), last = min((b1 - 1) / ROWS, la.tiles - 1);
    const i64 count = (r * la.tiles + j0) * a.groups + g;
    const A* h = la.partial + (r * la.tiles) * a.features + g * W;
    constexpr i64 CHUNK = LONG_CHUNK ? LONG_CHUNK : 1;  // (no division by 0 where there are no chunks)
    const bool chunks = LONG_CHUNK != 0 && last - j0 >= LONG_CHUNK;  // (never without LONG_CHUNK)
    A acc[W];
    if constexpr (LONG_CHUNK != 0) {
        if (chunks && j >= 0) {  // a tile of a segment of chunks: counted in its chunk
            const i64 c = j / CHUNK * CHUNK, lo = max(j0, c), hi = min(last, c + CHUNK - 1);
            unsigned long long* cc = la.chunk_count + count + (lo - j0) * a.groups;
            if (count_piece(la, cc) != hi - lo + 1) return;
            __threadfence();  // the chunk's other tiles, read below
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
            add_chain<OP, W>(acc, h, a.features, lo, hi - lo + 1, false);
            A* t = la.partial + (r * la.tiles + lo) * a.features + g * W;
#pragma unroll
            for (int k = 0; k < W; ++k) t[k] = acc[k];
            *cc = (unsigned long long)la.epoch << 32;  // (0 pieces of this epoch)
        }
    }
    unsigned long long* c = la.count + count;
    const i64 pieces = chunks ? last / CHUNK - j0 / CHUNK + 1 : last - j0 + 1;
    if (count_piece(la, c) != pieces + 1) return;  // (pieces: the head and each tile or chunk)
    __threadfence();
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = __ldcg(la.first + (r * la.tiles + j0) * a.features + g * W + k);
    add_chain<OP, W>(acc, h, a.features, j0, pieces, chunks);
    O* o = out + (r * a.m + s) * a.features + g * W;
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], b1 - b0);
    *c = (unsigned long long)la.epoch << 32;  // (0 pieces of this epoch)
}

// The head of long segment s = [begin, end) of batch row r, feature group g (its rows before
// its first tile, added into acc), written to first and counted as one of its pieces.
template <class O, class OP, bool MEAN, int W, int ROWS, class A>
__device__ __forceinline__ void long_head_done(O* __restrict__ out, const FeatureArgs& a, const LongArgs<A>& la,
                                               const A (&acc)[W], i64 r, i64 s, i64 g, i64 begin, i64 end) {
    A* h = la.first + (r * la.tiles + first_tile<ROWS>(begin)) * a.features + g * W;
#pragma unroll
    for (int k = 0; k < W; ++k) h[k] = acc[k];
    long_piece_done<O, OP, MEAN, W, ROWS>(out, a, la, r, s, g, begin, end, -1);
}

// partial[r, j, g] for tile item u = (r * tiles + j) * groups + g: the rows of tile j in the
// long segment its first row lies in (segment_of_row, checked against the offsets: bad
// offsets give wrong partials, never an access out of bounds), if any.
template <class T, class A, class O, class OP, bool MEAN, int W, int UNROLL, int ROWS, class Off>
__device__ __forceinline__ void long_tile(const T* __restrict__ x, O* __restrict__ out, Off off, const FeatureArgs& a,
                                          const LongArgs<A>& la, i64 u) {
    const i64 g = u % a.groups, rj = u / a.groups;
    const i64 r = rj / la.tiles, j = rj - r * la.tiles;
    const i64 r0 = j * ROWS;
    const i64 lo = segment_of_row(off, a.m, a.n, r0);
    if (lo < 0 || lo >= a.m) return;
    const i64 b0 = off(lo), b1 = off(lo + 1);
    if (!(0 <= b0 && b0 <= r0 && r0 < b1 && b1 <= a.n && b1 - b0 > la.long_rows)) return;
    A acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
    add_rows<T, A, OP, W, UNROLL>(acc, x + r * a.batch_stride + g * W, r0, min(b1, r0 + ROWS), a.row_stride);
    A* h = la.partial + rj * a.features + g * W;
#pragma unroll
    for (int k = 0; k < W; ++k) h[k] = acc[k];
    long_piece_done<O, OP, MEAN, W, ROWS>(out, a, la, r, lo, g, b0, b1, j);
}

template <class T, class A0, class O, class OP, bool MEAN, int W, int UNROLL, int ROWS, class Off>
__device__ __forceinline__ void features_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, FeatureArgs a,
                                                int* bad, LongArgs<typename SumWide<OP, A0>::type> la) {
    typedef typename SumWide<OP, A0>::type A;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    // With ROWS, the tiles of long segments are items after the segments: one launch reads all
    // the data, whatever the lengths.
    const i64 items = a.total + (ROWS > 0 ? la.tile_items : 0);
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < items; t += stride) {
        if constexpr (ROWS > 0) {
            if (t >= a.total) {
                long_tile<T, A, O, OP, MEAN, W, UNROLL, ROWS>(x, out, off, a, la, t - a.total);
                continue;
            }
        }
        const i64 g = t % a.groups, rs = t / a.groups;  // rs: batch row * m + segment
        const i64 r = rs / a.m, s = rs - r * a.m;
        i64 begin = off(s), end = off(s + 1);
        checked_bounds(s, a.m, a.n, bad, begin, end);
        const T* p = x + r * a.batch_stride + g * W;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
        if constexpr (ROWS > 0) {
            if (end - begin > la.long_rows) {  // the head here, the tiles in long_tile, the sum by the last
                if (!(0 <= begin && end <= a.n)) continue;  // (bad offsets, unchecked: nothing to write)
                add_rows<T, A, OP, W, UNROLL>(acc, p, begin, min(end, first_tile<ROWS>(begin) * ROWS), a.row_stride);
                long_head_done<O, OP, MEAN, W, ROWS>(out, a, la, acc, r, s, g, begin, end);
                continue;
            }
        }
        add_rows<T, A, OP, W, UNROLL>(acc, p, begin, end, a.row_stride);
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

// A pair's sum of its lanes (lane 0's acc) in features_split: its segment's result (kind 0), or
// the head of a long segment, written and counted as features_reduce counts it (kind 1).
template <class O, class OP, bool MEAN, int W, int ROWS, class A>
__device__ __forceinline__ void split_result(O* __restrict__ out, const FeatureArgs& a, const LongArgs<A>& la,
                                             const A (&acc)[W], int kind, i64 rs, i64 g, i64 begin, i64 end) {
    if (kind == 0) {
        O* o = out + rs * a.features + g * W;
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = finish<O, MEAN>(acc[k], end - begin);
        return;
    }
    if constexpr (ROWS > 0) {
        if (kind != 1) return;
        const i64 r = rs / a.m;
        long_head_done<O, OP, MEAN, W, ROWS>(out, a, la, acc, r, rs - r * a.m, g, begin, end);
    }
}

// features_split: features_reduce with each segment's rows dealt to R lanes, for segments
// too few to fill the device one thread per feature group.  A block holds P = blockDim / (R *
// groups) (row of the batch, segment) pairs; thread (p, j, g) adds rows begin + j, begin + j + R,
// ... of pair p's segment for feature group g (lanes of the same j read one row: coalesced),
// then the R partials of a group are added by a fixed tree (lane 0 + lane R/2, ...), so a
// result does not depend on timing: by shuffles where a pair's R * groups threads lie in one
// warp, else in shared memory.  R is a power of two and R * groups <= blockDim.  With ROWS, a
// segment of more than long_rows rows is cut as in features_reduce: its lanes add its head,
// lane 0 writes it, and after the pairs every thread takes tile items (long_tile).
template <class T, class A0, class O, class OP, bool MEAN, int W, int UNROLL, int ROWS, class Off>
__device__ __forceinline__ void features_split(const T* __restrict__ x, O* __restrict__ out, Off off, FeatureArgs a,
                                               int* bad, int lanes, LongArgs<typename SumWide<OP, A0>::type> la) {
    typedef typename SumWide<OP, A0>::type A;
    extern __shared__ unsigned char features_shared[];
    A* shared = reinterpret_cast<A*>(features_shared);
    const int per_pair = lanes * (int)a.groups;
    const int pairs = blockDim.x / per_pair;  // the host makes blockDim a multiple of per_pair
    const int p = threadIdx.x / per_pair, within = threadIdx.x - p * per_pair;
    const int j = within / (int)a.groups, g = within - j * (int)a.groups;
    const i64 count = a.total;  // (row of the batch, segment) pairs
    // (per_pair divides 32 only where lanes and groups are powers of two: the host's lanes are)
    const bool in_warp = (32 % per_pair) == 0 && (a.groups & (a.groups - 1)) == 0;
    // Every thread of a block runs the same number of rounds (the barriers below).
    for (i64 base = (i64)blockIdx.x * pairs; base < count; base += (i64)gridDim.x * pairs) {
        const i64 rs = base + p;
        const bool live = p < pairs && rs < count;
        A acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = OP::template identity<O, A>();
        i64 begin = 0, end = 0;
        // 0: the segment's result goes out; 1: its head goes to the long segment's pieces; 2:
        // nothing (a long segment's bounds out of [0, n], unchecked)
        int kind = 0;
        if (live) {
            const i64 r = rs / a.m, s = rs - r * a.m;
            begin = off(s);
            end = off(s + 1);
            checked_bounds(s, a.m, a.n, bad, begin, end);
            i64 stop = end;
            if constexpr (ROWS > 0) {
                if (end - begin > la.long_rows) {
                    kind = 0 <= begin && end <= a.n ? 1 : 2;
                    stop = kind == 1 ? min(end, first_tile<ROWS>(begin) * ROWS) : begin;
                }
            }
            add_rows<T, A, OP, W, UNROLL, true>(acc, x + r * a.batch_stride + g * W, begin + j, stop, a.row_stride,
                                                  lanes);
        }
        // The lanes' partials, added pairwise: lane j takes lane j + h for h = R/2, R/4, ..., 1.
        if (in_warp) {
            // A pair's threads lie in one warp (R * groups divides 32, both powers of two): the
            // same tree by shuffles, no barrier.  For j < h, lane j ^ h is lane j + h, so lane 0
            // adds what the tree in shared memory adds, in the same order.
            for (int h = lanes / 2; h > 0; h /= 2) {
#pragma unroll
                for (int k = 0; k < W; ++k) acc[k] = OP::combine(acc[k], shfl_xor(acc[k], h * (int)a.groups));
            }
            if (live && j == 0) split_result<O, OP, MEAN, W, ROWS>(out, a, la, acc, kind, rs, g, begin, end);
            continue;
        }
        A* mine = shared + (size_t)threadIdx.x * W;
#pragma unroll
        for (int k = 0; k < W; ++k) mine[k] = acc[k];
        __syncthreads();
        for (int h = lanes / 2; h > 0; h /= 2) {
            if (j < h) {
                const A* other = shared + (size_t)(threadIdx.x + h * (int)a.groups) * W;
#pragma unroll
                for (int k = 0; k < W; ++k) mine[k] = OP::combine(mine[k], other[k]);
            }
            __syncthreads();
        }
        if (live && j == 0) {
#pragma unroll
            for (int k = 0; k < W; ++k) acc[k] = mine[k];
            split_result<O, OP, MEAN, W, ROWS>(out, a, la, acc, kind, rs, g, begin, end);
        }
        __syncthreads();  // shared is read before the next round writes it
    }
    if constexpr (ROWS > 0) {
        // The tiles of long segments: one thread each, as in features_reduce.
        for (i64 u = (i64)blockIdx.x * blockDim.x + threadIdx.x; u < la.tile_items; u += (i64)gridDim.x * blockDim.x)
            long_tile<T, A, O, OP, MEAN, W, UNROLL, ROWS>(x, out, off, a, la, u);
    }
}

// ---- entry points -----------------------------------------------------------------
// linred_features: features_reduce; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
#define LINRED_FEATURES(T, A, O, OP, MEAN, THREADS, W, UNROLL, I, OFFSETS)                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,         \
                        long long bs, long long rs, long long d, long long groups, long long total) {                  \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_reduce<T, A, O, OP, MEAN, W, UNROLL, 0>(x, out, OFFSETS, a, bad, LongArgs<SumWide<OP, A>::type>{});   \
    }

// linred_features with ROWS: features_reduce cutting long segments into tiles; its arguments,
// then long_rows, the tiles per batch row, tile_items (batch * tiles * groups), the heads, the
// partials, the counts (of segments, then of chunks from count + tile_items) and this call's
// epoch.
#define LINRED_FEATURES_LONG(T, A, O, OP, MEAN, THREADS, W, UNROLL, ROWS, I, OFFSETS)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features(const T* x, O* out, const I* offsets, int* bad, long long L, long long n, long long m,         \
                        long long bs, long long rs, long long d, long long groups, long long total,                   \
                        long long long_rows, long long tiles, long long tile_items, SumWide<OP, A>::type* first,      \
                        SumWide<OP, A>::type* partial, unsigned long long* count, long long epoch) {                   \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_reduce<T, A, O, OP, MEAN, W, UNROLL, ROWS>(                                                           \
            x, out, OFFSETS, a, bad,                                                                                   \
            LongArgs<SumWide<OP, A>::type>{long_rows, tiles, tile_items, first, partial, count,                        \
                                           count + tile_items, (unsigned)epoch});                                      \
    }

// linred_features_split: features_split (lanes = R, total = batch * m pairs).
#define LINRED_FEATURES_SPLIT(T, A, O, OP, MEAN, THREADS, W, UNROLL, I, OFFSETS)                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features_split(const T* x, O* out, const I* offsets, int* bad, long long L, long long n,                \
                              long long m, long long bs, long long rs, long long d, long long groups,                  \
                              long long total, long long lanes) {                                                      \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_split<T, A, O, OP, MEAN, W, UNROLL, 0>(x, out, OFFSETS, a, bad, (int)lanes,                           \
                                                        LongArgs<SumWide<OP, A>::type>{});                            \
    }

// linred_features_split with ROWS: features_split cutting long segments into tiles; its
// arguments, then those LINRED_FEATURES_LONG adds.
#define LINRED_FEATURES_SPLIT_LONG(T, A, O, OP, MEAN, THREADS, W, UNROLL, ROWS, I, OFFSETS)                            \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                              \
        linred_features_split(const T* x, O* out, const I* offsets, int* bad, long long L, long long n,                \
                              long long m, long long bs, long long rs, long long d, long long groups,                  \
                              long long total, long long lanes, long long long_rows, long long tiles,                 \
                              long long tile_items, SumWide<OP, A>::type* first, SumWide<OP, A>::type* partial,       \
                              unsigned long long* count, long long epoch) {                                            \
        FeatureArgs a{n, m, bs, rs, d, groups, total};                                                                 \
        features_split<T, A, O, OP, MEAN, W, UNROLL, ROWS>(                                                            \
            x, out, OFFSETS, a, bad, (int)lanes,                                                                       \
            LongArgs<SumWide<OP, A>::type>{long_rows, tiles, tile_items, first, partial, count,                        \
                                           count + tile_items, (unsigned)epoch});                                      \
    }
