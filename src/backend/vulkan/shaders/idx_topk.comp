// idx_topk.comp - the indexer's selection (backend.h indexer_topk) for the rows r0 .. r0 + nr
// of a step, one workgroup per row over the scores idx_scores.comp left (row r0 + y's at
// o0 + y * stride): the topk best, higher score first and ties to the lower id, their ids
// written ascending. A radix select on the scores' order-preserving bits finds the k-th best
// score T (histograms with integer atomics: counts, the same in any order); then the keys
// above T and the first of those equal to T in id order are kept, placed by a prefix sum
// over the ids in order. Deterministic; a row that keeps every key gets 0 .. n_done - 1.
// DeepSeek-V4.1's candidate blocks (backend.h struct dsv4_idx_cand): cmode 1 (the candidate
// source) then scores each block by its best key at bs0 past the row's key scores (its newest
// block +inf) and keeps the n_keep best blocks the same way, ids ascending in cand[], -1 after;
// cmode 2 (a later indexer) first sets the scores of keys outside the row's blocks (a binary
// search in its ascending list) to -inf and keeps min(topk, their keys) of the others.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "step.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer SC { float sc[]; };
layout(std430, set = 0, binding = 1) writeonly buffer SEL { int sel[]; };
layout(std430, set = 0, binding = 2) writeonly buffer NS { int n_sel[]; };
layout(std430, set = 0, binding = 3) buffer CAND { int cand[]; };
// ratio: positions per key (a row's completed keys: (its position + 1) / ratio)
layout(push_constant) uniform P {
    uint64_t step;
    uint sc0, stride, sel0, nsel0, r0, nr, topk, ratio;
    uint cmode, cblock, n_keep, cand0, bs0; // candidate blocks: cmode 0 none, 1 pick, 2 obey
} p;

shared uint hist[256], scan[256], s_digit, s_kk, s_n;

// Higher score, higher key; -0 as +0 (they tie).
uint key_of(float s)
{
    uint u = floatBitsToUint(s);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// The k-th largest key among n (at base) into the return value, and in *kk how many keys
// equal to it are kept.
uint kth_key(uint base, uint n, uint k, out uint kk)
{
    uint lid = gl_LocalInvocationID.x, prefix = 0u, mask = 0u;
    kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist[lid] = 0u;
        barrier();
        for (uint j = lid; j < n; j += 256u) {
            uint key = key_of(sc[base + j]);
            if ((key & mask) == prefix) atomicAdd(hist[(key >> shift) & 255u], 1u);
        }
        barrier();
        if (lid == 0u) {
            uint acc = 0u, b = 255u;
            for (; b > 0u && acc + hist[b] < kk; b--) acc += hist[b];
            s_digit = b, s_kk = kk - acc;
        }
        barrier();
        prefix |= s_digit << shift, mask |= 255u << shift, kk = s_kk;
        barrier();
    }
    return prefix;
}

// The ids of keys above t and the first kk equal to t, ascending, to out0 (of sel, or of cand).
void keep(uint base, uint n, uint t, uint kk, uint out0, bool to_cand)
{
    uint lid = gl_LocalInvocationID.x, gt0 = 0u, eq0 = 0u;
    for (uint c0 = 0u; c0 < n; c0 += 256u) {
        uint j = c0 + lid, key = j < n ? key_of(sc[base + j]) : 0u;
        uint v = j < n ? (key > t ? 1u : 0u) | (key == t ? 0x10000u : 0u) : 0u;
        scan[lid] = v;
        barrier();
        for (uint off = 1u; off < 256u; off *= 2u) {
            uint add = lid >= off ? scan[lid - off] : 0u;
            barrier();
            scan[lid] += add;
            barrier();
        }
        uint ex = scan[lid] - v, gt = gt0 + (ex & 0xffffu), eq = eq0 + (ex >> 16);
        if ((v & 1u) != 0u || ((v >> 16) != 0u && eq < kk)) {
            if (to_cand) cand[out0 + gt + min(eq, kk)] = int(j);
            else sel[out0 + gt + min(eq, kk)] = int(j);
        }
        gt0 += scan[255] & 0xffffu, eq0 += scan[255] >> 16;
        barrier();
    }
}

// The k best of the n scores at base, ids ascending, to out0 (k < n; of sel or of cand).
void best(uint base, uint n, uint k, uint out0, bool to_cand)
{
    uint kk, t = kth_key(base, n, k, kk);
    keep(base, n, t, kk, out0, to_cand);
}

// cmode 1: row r's blocks scored at bs (each its best key, the newest +inf), the n_keep best kept.
void pick_blocks(uint base, uint done, uint r)
{
    uint lid = gl_LocalInvocationID.x, nb = (done + p.cblock - 1u) / p.cblock, kb = min(p.n_keep, nb);
    uint bs = base + p.bs0, c0 = p.cand0 + r * p.n_keep;
    barrier(); // the keys' selection has read the scores
    for (uint b = lid; b < nb; b += 256u) {
        float m = uintBitsToFloat(0xff800000u);
        for (uint j = b * p.cblock; j < min(done, (b + 1u) * p.cblock); j++) m = max(m, sc[base + j]);
        sc[bs + b] = b + 1u == nb ? uintBitsToFloat(0x7f800000u) : m;
    }
    barrier();
    for (uint i = kb + lid; i < p.n_keep; i += 256u) cand[c0 + i] = -1;
    if (kb == nb) {
        for (uint b = lid; b < nb; b += 256u) cand[c0 + b] = int(b);
    } else if (kb > 0u) {
        best(bs, nb, kb, c0, true);
    }
}

// Key j is in one of row r's candidate blocks (ascending, -1 after the last).
bool in_cand(uint r, uint j)
{
    int  b  = int(j / p.cblock);
    uint lo = 0u, hi = p.n_keep, c0 = p.cand0 + r * p.n_keep;
    while (lo < hi) { // the first entry >= b, -1 counting as past every block
        uint mid = (lo + hi) / 2u;
        int  c   = cand[c0 + mid];
        if (c >= 0 && c < b) lo = mid + 1u;
        else hi = mid;
    }
    return lo < p.n_keep && cand[c0 + lo] == b;
}

// cmode 2: keys outside row r's blocks to -inf; returns how many are inside.
uint obey_blocks(uint base, uint done, uint r)
{
    uint lid = gl_LocalInvocationID.x;
    if (lid == 0u) s_n = 0u;
    barrier();
    uint n = 0u;
    for (uint j = lid; j < done; j += 256u) {
        if (in_cand(r, j)) n++;
        else sc[base + j] = uintBitsToFloat(0xff800000u);
    }
    atomicAdd(s_n, n);
    barrier();
    return s_n;
}

void main()
{
    StepRef st = StepRef(p.step);
    uint    lid = gl_LocalInvocationID.x;
    for (uint y = gl_WorkGroupID.x; y < p.nr; y += gl_NumWorkGroups.x) {
        uint r = p.r0 + y, done = uint(step_int(p.step, st.pos + r) + 1) / p.ratio, base = p.sc0 + y * p.stride;
        uint n = p.cmode == 2u ? obey_blocks(base, done, r) : done, k = min(p.topk, n);
        if (lid == 0u) n_sel[p.nsel0 + r] = int(k);
        uint out0 = p.sel0 + r * p.topk;
        if (k == done) {
            for (uint j = lid; j < k; j += 256u) sel[out0 + j] = int(j);
        } else if (k > 0u) {
            best(base, done, k, out0, false);
        }
        if (p.cmode == 1u) pick_blocks(base, done, r);
        barrier();
    }
}
