// hc_head.comp - the op hc_head (backend.h): per row the hc mixing weights (hc_mix.glsl),
// w[j] = f32(sigmoid(f32(mix[j] scale + base[j])) + eps) with exp from dmath.glsl, then
// y = bf16(sum_j w[j] X[j]) over d, in double in the reference's order
// (src/backend/cpu/ref_ops.c). One workgroup per row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "dmath.glsl"

layout(local_size_x = 128) in;
layout(std430, set = 0, binding = 0) readonly buffer Xin { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer FN { float fn[]; };
layout(std430, set = 0, binding = 2) readonly buffer S { float scale[]; };
layout(std430, set = 0, binding = 3) readonly buffer B { float base[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { double norm_eps, hc_eps; uint x0, fn0, s0, b0, y0, n, hc, d; } p;

#include "hc_mix.glsl"

shared double s_w[8];

void main()
{
    uint lid = gl_LocalInvocationID.x, hc = p.hc, d = p.d;
    for (uint r = gl_WorkGroupID.x; r < p.n; r += gl_NumWorkGroups.x) {
        uint xr = p.x0 + r * hc * d;
        hc_mix(xr, p.fn0, hc * d, hc, p.norm_eps);
        if (lid < hc) {
            precise double t = s_mix[lid] * double(scale[p.s0]) + double(base[p.b0 + lid]);
            precise double w = 1.0LF / (1.0LF + dexp(-double(float(t)))) + p.hc_eps;
            s_w[lid] = double(float(w));
        }
        barrier();
        for (uint i = lid; i < d; i += HC_WG) {
            precise double acc = 0.0LF;
            for (uint j = 0u; j < hc; j++) acc += s_w[j] * double(x[xr + j * d + i]);
            y[p.y0 + r * d + i] = round_bf16(float(acc));
        }
        barrier();
    }
}
