// compress.comp - the op compress (backend.h; docs/MODEL.md §R3.6): the compressor's token
// loop of every sequence of the step, one invocation per (channel, sequence). A channel's
// columns (ch, and d + ch with overlap) of the frontier in the slot are its own: it stores
// each row's values and gates there, pools the block a row completes (softmax in double,
// dmath.glsl, in the reference's order, `precise` so nothing is fused) into its sequence's
// next output row (rounded to bf16) and, with overlap, moves the current block to the
// previous one. Follows ops_data.c's pool() step for step.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "step.glsl"
#include "dmath.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer G { float g[]; };
layout(std430, set = 0, binding = 2) readonly buffer E { float ape[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint64_t step, kv_off, sc_off; uint a0, g0, ape0, o0, ratio, d, overlap; } p;

// The pooled value of channel ch of the frontier (kv, sc; rows of w), n candidates.
float pool(FloatRef kv, FloatRef sc, uint ch, uint n, uint w)
{
    bool   ov = p.overlap != 0u;
    double m  = -1.0LF / 0.0LF;
    for (uint i = 0u; i < n; i++) {
        double gi = double(sc.f[i * w + (ov && i >= p.ratio ? p.d + ch : ch)]);
        if (gi > m) m = gi; // fmax: a NaN is skipped
    }
    precise double sum = 0.0LF;
    for (uint i = 0u; i < n; i++) sum += dexp(double(sc.f[i * w + (ov && i >= p.ratio ? p.d + ch : ch)]) - m);
    precise double acc = 0.0LF;
    for (uint i = 0u; i < n; i++) {
        uint           col = ov && i >= p.ratio ? p.d + ch : ch;
        precise double pr  = dexp(double(sc.f[i * w + col]) - m) / sum;
        acc += pr * double(kv.f[i * w + col]);
    }
    return float(acc);
}

// The compressed rows of the sequences before s.
uint block0(StepRef st, int s)
{
    int b = 0, r = int(p.ratio);
    for (int i = 0; i < s; i++) b += (st.seq[i].p0 + st.seq[i].n) / r - st.seq[i].p0 / r;
    return uint(b);
}

void main()
{
    StepRef st = StepRef(p.step);
    uint    ch = gl_GlobalInvocationID.x, s = gl_WorkGroupID.y;
    if (ch >= p.d || int(s) >= st.n_seqs) return;
    Seq  q  = st.seq[s];
    bool ov = p.overlap != 0u;
    uint w = ov ? 2u * p.d : p.d, nc = ov ? 2u : 1u, ob = block0(st, int(s));
    FloatRef kv = FloatRef(q.slot + p.kv_off), sc = FloatRef(q.slot + p.sc_off);
    for (int t = 0; t < q.n; t++) {
        uint pos = uint(q.p0 + t), slot = pos % p.ratio, dst = ov ? p.ratio + slot : slot, row = uint(q.row0 + t);
        for (uint c = 0u; c < nc; c++) {
            uint col = ch + c * p.d;
            kv.f[dst * w + col] = a[p.a0 + row * w + col];
            sc.f[dst * w + col] = g[p.g0 + row * w + col] + ape[p.ape0 + slot * w + col];
        }
        if ((pos + 1u) % p.ratio != 0u) continue;
        o[p.o0 + ob * p.d + ch] = round_bf16(pool(kv, sc, ch, ov ? 2u * p.ratio : p.ratio, w));
        ob++;
        for (uint c = 0u; ov && c < nc; c++)
            for (uint i = 0u; i < p.ratio; i++) {
                uint col = ch + c * p.d;
                kv.f[i * w + col] = kv.f[(p.ratio + i) * w + col];
                sc.f[i * w + col] = sc.f[(p.ratio + i) * w + col];
            }
    }
}
