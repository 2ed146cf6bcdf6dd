// tile_reduce: any segments (offsets, or a fixed length of any size), any strides,
// one feature column, or feature columns that are not contiguous, each reduced as a row
// of its own (TileArgs::inner).
//
// Holds:
//  - tile_reduce: a block walks K consecutive tiles of TILE elements, staging each in
//    shared memory while the next one loads, and reduces every segment that
//    intersects it: sub-warp groups when the tile holds many segments, several warps
//    per segment when it holds few.  A segment open at the end of a tile is carried
//    to the next; one still open at the end of the block leaves a partial for
//    tile_fixup (fixup.cuh).
//  - tile_bounds: for offsets, the first segment of every tile (a binary search per
//    tile; warp_reduce's warps search for their own).
//  - warp_keyed_scan, block_keyed_scan: segmented scans keyed by segment starts;
//    TileShared: tile_reduce's dynamic shared memory.
//  - their entry points: LINRED_TILE (linred_tile, with check_tile_shared: a compile-time
//    check of the shared memory the backend launches it with) and LINRED_BOUNDS
//    (linred_bounds).

#pragma once

#include "offsets.cuh"

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
// computes the same sizes (linred/backends/nvrtc/kernels.py, tile_shared_bytes), and
// linred_tile checks them when it is compiled (check_tile_shared).
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
    const T* xr = x + tile_row_start(a, row);
    O* outr = out + tile_out_start(a, row);
    const i64 os = tile_out_stride(a);  // (1 but for strided features)
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
                    outr[(s) * os] = finish<O, MEAN>(total, end - begin);
                } else {
                    head[b] = total;  // the block's whole part of a segment begun before it
                }
            } else if (end > t1) {
                next_s = s;
                next_acc = acc;
                next_mode = CARRY_OWN;
            } else {
                outr[(s) * os] = finish<O, MEAN>(acc, end - begin);
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
            acc = warp_all<A, OP>(acc);
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
                    outr[(s_first + seg_at[prev]) * os] = finish<O, MEAN>(sh[at(p)], p - prev);
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
                if (sb[k] == sb[k + 1]) outr[(s_first + k) * os] = finish<O, MEAN>(identity, 0);
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
                            outr[(s_first + cur) * os] = finish<O, MEAN>(acc, end - sb[cur]);
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
                if (sb[k] == sb[k + 1]) outr[(s_first + k) * os] = finish<O, MEAN>(identity, 0);
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

// ---- entry points -----------------------------------------------------------------
// The backend computes the dynamic shared memory it launches linred_tile with
// (linred/backends/nvrtc/kernels.py, tile_shared_bytes): the compiler checks it here.
// Called after tile_reduce, so that it instantiates nothing tile_reduce has not.
template <class T, class A, int THREADS, int TILE, bool VECLOAD, int SHARED>
__device__ __forceinline__ void check_tile_shared() {
    static_assert(TileShared<T, A, THREADS, TILE, VECLOAD>::BYTES == SHARED,
                  "linred_tile is launched with other dynamic shared memory than TileShared::BYTES");
}


// linred_tile: tile_reduce; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
// SHARED: the bytes of dynamic shared memory it is launched with.
#define LINRED_TILE(T, A, O, OP, MEAN, THREADS, MIN_BLOCKS, TILE, K, VECLOAD, I, OFFSETS, SHARED)             \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                                          \
        linred_tile(const T* x, O* out, LINRED_TILE_PARAMS(I), A* head, A* tail, long long* ts, A*) {          \
        extern __shared__ __align__(16) unsigned char smem[];                                                  \
        LINRED_TILE_ARGS                                                                                       \
        tile_reduce<T, A, O, OP, MEAN, THREADS, TILE, K, VECLOAD>(x, out, OFFSETS, a, bounds, head, tail, ts,  \
                                                                   smem);                                       \
        check_tile_shared<T, A, THREADS, TILE, VECLOAD, SHARED>();                                             \
    }

// linred_bounds: tile_bounds, one thread per tile boundary.
#define LINRED_BOUNDS(THREADS, TILE, I, OFFSETS)                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS) linred_bounds(LINRED_TILE_PARAMS(I)) {               \
        tile_bounds<TILE>(OFFSETS, m, n, tpr, const_cast<long long*>(bounds));                                 \
    }
