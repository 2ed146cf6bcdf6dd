// warp_reduce: any segments of contiguous, 16-byte aligned rows, one feature column.
//
// Holds:
//  - warp_reduce: every warp walks up to K consecutive warp tiles of 32 * ITEMS
//    elements on its own (no block barriers), marking segment starts in a bitmask and
//    joining the pieces that cross lanes with a segmented warp scan; a segment still
//    open at the end of a warp's run leaves a partial for tile_fixup (fixup.cuh);
//  - WarpShared (its dynamic shared memory per warp) and WarpState;
//  - its entry point: LINRED_WARP (linred_warp, with check_warp_shared: a compile-time
//    check of the tile size and shared memory the backend launches it with; with FUSED, the
//    fix-up done by its last block, for small grids).
//
// With CHECKED, warp_reduce also checks the offsets it reads (check=True without a pass of
// its own): see "Offsets checked as they are read" below.

#pragma once

#include "offsets.cuh"

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
//
// Offsets checked as they are read (CHECKED; bad is the word the host reads after the
// call, set to 1 when a rule is broken).  A warp's walk is the segments it reads the
// offsets of: from its run's first (found by warp_segment_at_or_after) through the first
// one past the run.  A batch of 64 is a chain (lane i reads offsets[s + 1] where lane i + 1
// reads offsets[s + 1], and the next batch begins where this one ends; past m it goes on
// through offsets[m], then n), so it keeps
// t0 <= offsets[s] <= offsets[s + 1] <= n for every pair it reads (t0: the tile being
// walked; no segment at or after the tile's first one starts before the tile) when each
// lane's pair does not decrease, its first offset is at least t0 and its last at most n.
// Each warp records where its walk began and ended (walks[2c], walks[2c + 1]); tile_fixup
// checks that every walk ends where the next run's begins, the warp itself that the row's
// first walk begins at segment 0 with offsets[0] == 0 and its last ends at m with
// offsets[m] == n.  So the walks join up into [0, m] and every rule linred_check_offsets
// tests is tested.  A batch that breaks a rule is not used: the warp stops there (its
// partials say nothing is carried), so no mark, load or store leaves the tile, the row or
// [0, m) whatever the offsets hold; the results are then undefined and the host raises.
// (Where the chain reaches offsets[m], a batch also requires offsets[m] == n: with a shorter
// last offset, a tile's last segment could end inside a tile that is not the row's last with
// no segment after it, leaving the segment carried to the fix-up unset.)
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

template <class T, class A, class O, class OP, bool MEAN, int THREADS, int K, bool CHECKED, class Off>
__device__ __forceinline__ void warp_reduce(const T* __restrict__ x, O* __restrict__ out, Off off, TileArgs a,
                                            A* __restrict__ head, A* __restrict__ tail,
                                            i64* __restrict__ tail_seg, A* __restrict__ group_head,
                                            i64* __restrict__ walks, int* __restrict__ bad,
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
    const T* xr = x + row * a.row_stride;  // (inner == 1: the backend gives strided features to tile_reduce)
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
    if (CHECKED && lane == 0) st->open_s = -1;  // (never read unset: see the batches' check)
    __syncwarp();
    if (active) fetch(j0);

    // The segment open at the end of the previous tile: none yet, one that began before
    // this warp's tiles (its part goes to head[c]), or one of its own (index, start).
    int mode = CARRY_NONE;
    A carry = identity;
    i64 s_first = active ? warp_segment_at_or_after(off, a.m, j0 * (i64)WT, lane) : 0;  // first segment at or after t0
    // CHECKED: whether the offsets broke a rule (the row's first walk must begin at 0).
    bool broken = false;
    if (CHECKED && active) {
        if (lane == 0) walks[2 * c] = s_first;
        broken = j0 == 0 && (s_first != 0 || off(0) != Off::origin);
    }
    const int tiles = broken ? 0 : (int)(j1 - j0);  // K at most: an int counter, two registers fewer than an i64
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
                    } else if (CHECKED && s == a.m) {
                        begins[u] = off(s);  // (the chain goes on through offsets[m], checked <= n)
                    }
                }
                if (CHECKED) {  // the batch is used only if its chain keeps the rules
                    bool ok = lane != 0 || begins[0] >= t0;
                    ok &= lane != 31 || ends[WB - 1] <= a.n;
#pragma unroll
                    for (int u = 0; u < WB; ++u) {
                        ok &= begins[u] <= ends[u];  // (past m: n, n)
                        // offsets[m] == n where the chain reaches it: a last offset short of n would
                        // let a tile's last segment end inside a tile that is not the row's last,
                        // with nothing after it to finish it (the carried segment never set)
                        ok &= s_first + owned + u * 32 + lane != a.m || begins[u] == a.n;
                    }
                    broken = !__all_sync(0xffffffffu, ok);
                    if (broken) break;
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
            if (CHECKED && broken) break;  // (before any mark of the batch is read)
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
            acc = warp_all<A, OP>(acc);
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
            A before = shfl_up(acc, 1);
            if (lane == 0) before = identity;
            const A total = shfl_idx(acc, 31);
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
    if (CHECKED && active) {
        // The row's last walk ends at m, with offsets[m] == n; where the others end, tile_fixup
        // compares with where the next run's begins.
        if (!broken && j1 == a.tiles_per_row) broken = s_first != a.m || off(a.m) != a.n;
        if (lane == 0) walks[2 * c + 1] = s_first;
        if (broken) {
            mode = CARRY_NONE;  // nothing of this run for the fix-up
            if (lane == 0) *bad = 1;  // every writer writes the same value
        }
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

// ---- entry points -----------------------------------------------------------------
// The backend computes the warp tile (elements) and the dynamic shared memory it launches
// linred_warp with (linred/backends/nvrtc/kernels.py, warp_items and warp_shared_bytes):
// the compiler checks them here.  Called after warp_reduce, so that it instantiates nothing
// warp_reduce has not.
template <class T, class A, int THREADS, int WARP_TILE, int SHARED>
__device__ __forceinline__ void check_warp_shared() {
    static_assert(WarpShared<T, A>::WT == WARP_TILE && THREADS / 32 * WarpShared<T, A>::WARP_BYTES == SHARED,
                  "linred_warp is launched with another tile or shared memory than WarpShared's");
}


// linred_warp: warp_reduce; OFFSETS is FixedOffsets{L} or ArrayOffsets<I>{offsets}.
// WARP_TILE and SHARED: the elements per warp tile and the bytes of dynamic shared memory the
// backend launches it with.  CHECKED: the offsets are checked as they are read, into *bad,
// with two words per run in walks (the other variant ignores both).  FUSED: the fix-up is done
// by the kernel's last block (last_block_fixup, fixup.cuh; G: runs per group head, the
// block's warps), counted by *ticket, which is zero before the launch and after it; without
// FUSED, linred_fixup follows (ticket is ignored).
#define LINRED_WARP(T, A, O, OP, MEAN, THREADS, MIN_BLOCKS, K, I, OFFSETS, WARP_TILE, SHARED, CHECKED, FUSED, G)   \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) linred_warp(                             \
        const T* x, O* out, LINRED_TILE_PARAMS(I), A* head, A* tail, long long* ts, A* gh, long long* walks,   \
        int* bad, unsigned* ticket) {                                                                           \
        extern __shared__ __align__(16) unsigned char smem[];                                                  \
        LINRED_TILE_ARGS                                                                                       \
        warp_reduce<T, A, O, OP, MEAN, THREADS, K, CHECKED>(x, out, OFFSETS, a, head, tail, ts, gh, walks, bad, \
                                                             smem);                                           \
        check_warp_shared<T, A, THREADS, WARP_TILE, SHARED>();                                                 \
        if constexpr (FUSED)                                                                                   \
            last_block_fixup<T, A, O, OP, MEAN, THREADS, WARP_TILE, G, CHECKED>(out, OFFSETS, a, head, tail, ts,  \
                                                                                gh, walks, bad, ticket);       \
    }
