// moe_dispatch.comp - the group table and the pairs' order of the op moe_dispatch (backend.h;
// src/backend/cpu/ops_data.c): a counting sort of the (row, slot) pairs by expert, experts
// ascending, pairs in order within one. One workgroup: the counts in shared memory (integer
// atomics: the same counts in any order), then the scan and the pairs' places by invocation 0
// in order, so the result is the same whatever the device. moe_gather.comp then moves the
// rows. row_w is written here.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "lin.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    uint64_t ids, w, row_w, pair_of, grp;
    uint n_pairs, n_exp;
} p;

shared int next[4096]; // DSV4_MAX_EXPERTS: counts, then each expert's next free pair

void main()
{
    uint lid = gl_LocalInvocationID.x;
    Ints ids = Ints(p.ids);
    for (uint e = lid; e < p.n_exp; e += 64u) next[e] = 0;
    barrier();
    for (uint i = lid; i < p.n_pairs; i += 64u) {
        int e = ids.v[i];
        if (e >= 0 && uint(e) < p.n_exp) atomicAdd(next[e], 1);
    }
    barrier();
    if (lid != 0u) return;
    OutInts grp = OutInts(p.grp);
    int     n_groups = 0, np = 0;
    for (uint e = 0u; e < p.n_exp; e++) {
        int c   = next[e];
        next[e] = np;
        if (c == 0) continue;
        grp.v[1 + n_groups]             = int(e);
        grp.v[1u + p.n_exp + n_groups] = np;
        n_groups++;
        np += c;
    }
    grp.v[0] = n_groups;
    for (uint g = uint(n_groups); g < p.n_exp; g++) grp.v[1u + g] = -1;
    for (uint g = uint(n_groups); g <= p.n_exp; g++) grp.v[1u + p.n_exp + g] = np;
    OutInts   pair_of = OutInts(p.pair_of);
    OutFloats row_w   = OutFloats(p.row_w);
    for (uint i = 0u; i < p.n_pairs; i++) {
        int e = ids.v[i];
        if (e < 0 || uint(e) >= p.n_exp) continue;
        int at     = next[e]++;
        pair_of.v[i] = at;
        row_w.v[at]  = Floats(p.w).v[i];
    }
}
