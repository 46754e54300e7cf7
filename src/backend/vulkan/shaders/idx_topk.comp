// idx_topk.comp - the indexer's selection (backend.h indexer_topk) for the rows r0 .. r0 + nr
// of a step, one workgroup per row over the scores idx_scores.comp left (row r0 + y's at
// o0 + y * stride): the topk best, higher score first and ties to the lower id, their ids
// written ascending. A radix select on the scores' order-preserving bits finds the k-th best
// score T (histograms with integer atomics: counts, the same in any order); then the keys
// above T and the first of those equal to T in id order are kept, placed by a prefix sum
// over the ids in order. Deterministic; a row that keeps every key gets 0 .. n_done - 1.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "step.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer SC { float sc[]; };
layout(std430, set = 0, binding = 1) writeonly buffer SEL { int sel[]; };
layout(std430, set = 0, binding = 2) writeonly buffer NS { int n_sel[]; };
// ratio: positions per key (a row's completed keys: (its position + 1) / ratio)
layout(push_constant) uniform P { uint64_t step; uint sc0, stride, sel0, nsel0, r0, nr, topk, ratio; } p;

shared uint hist[256], scan[256], s_digit, s_kk;

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

// The ids of keys above t and the first kk equal to t, ascending, to out0.
void keep(uint base, uint n, uint t, uint kk, uint out0)
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
        if ((v & 1u) != 0u || ((v >> 16) != 0u && eq < kk)) sel[out0 + gt + min(eq, kk)] = int(j);
        gt0 += scan[255] & 0xffffu, eq0 += scan[255] >> 16;
        barrier();
    }
}

void main()
{
    StepRef st = StepRef(p.step);
    uint    lid = gl_LocalInvocationID.x;
    for (uint y = gl_WorkGroupID.x; y < p.nr; y += gl_NumWorkGroups.x) {
        uint r = p.r0 + y, done = uint(step_int(p.step, st.pos + r) + 1) / p.ratio, k = min(p.topk, done);
        if (lid == 0u) n_sel[p.nsel0 + r] = int(k);
        uint out0 = p.sel0 + r * p.topk;
        if (k == done) {
            for (uint j = lid; j < k; j += 256u) sel[out0 + j] = int(j);
            continue;
        }
        uint kk, t = kth_key(p.sc0 + y * p.stride, done, k, kk);
        keep(p.sc0 + y * p.stride, done, t, kk, out0);
    }
}
