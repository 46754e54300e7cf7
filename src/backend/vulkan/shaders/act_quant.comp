// act_quant.comp - DSV4_ACT_FP8 (backend.h linear): each 128-block of a row of x becomes
// e4m3 codes times the power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)), written back
// as their f32 values code * scale (exact), which the projections then multiply. The same
// steps as the reference's quant_row (src/backend/cpu/ref_linear.c), on the bits: the scale
// and its reciprocal are powers of two (ldexp), e4m3 rounding is to nearest even with
// saturation at 448, so the values are the reference's exactly. One invocation per block;
// q may be x (a block is read whole before it is written).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "lin.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    uint64_t x, q;
    uint ldx, ldq, rows, n_in;
} p;

// The exponent of the block scale (dsv4_act_scale with qmax 448, floor 1e-4).
int scale_exp(float amax)
{
    if (!(amax >= 1e-4)) amax = 1e-4;
    uint u = floatBitsToUint(amax * (1.0 / 448.0)), ef = (u >> 23) & 255u;
    if (ef == 255u) return 0; // an infinite maximum: scale 1, the block saturates
    return int(ef) - 127 + ((u & 0x7fffffu) != 0u ? 1 : 0);
}

// v rounded to e4m3 (dsv4_e4m3_from_f32) and decoded.
float e4m3_round(float v)
{
    if (isnan(v)) return v;
    float a = min(abs(v), 448.0);
    int   e;
    frexp(a, e);
    e = max(e - 1, -6);
    float q = ldexp(roundEven(ldexp(a, 3 - e)), e - 3);
    return v < 0.0 ? -q : q;
}

void main()
{
    uint nkb = (p.n_in + 127u) / 128u, total = p.rows * nkb, stride = gl_NumWorkGroups.x * 64u;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint   r = i / nkb, b = (i % nkb) * 128u, end = min(b + 128u, p.n_in);
        Floats x = Floats(p.x + uint64_t(r) * uint64_t(p.ldx) * 4ul);
        float  amax = 0.0;
        for (uint k = b; k < end; k++) {
            float a = abs(x.v[k]);
            if (a > amax) amax = a; // a NaN is passed over, as fmaxf does
        }
        int       se = scale_exp(amax);
        OutFloats q  = OutFloats(p.q + uint64_t(r) * uint64_t(p.ldq) * 4ul);
        for (uint k = b; k < end; k++) q.v[k] = ldexp(e4m3_round(ldexp(x.v[k], -se)), se);
    }
}
