// head_rms.comp - the op head_rms (backend.h): in place over q[n, n_head, d_head], each head
// v = bf16(v * r) with r = bf16(1 / sqrt(bf16(bf16(sum bf16(v^2) / d) + eps))), every step in
// double and rounded to bf16 as the reference (src/backend/cpu/ref_ops.c). One workgroup per
// head: its first invocation sums in the reference's order (the squares are rounded to bf16,
// so their sum in double is exact only when their exponents are close: the order matters),
// then all of them scale the head.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Q { float q[]; };
layout(push_constant) uniform P { double eps; uint q0, heads, d; } p;

shared double s_r;

void main()
{
    uint lid = gl_LocalInvocationID.x;
    for (uint h = gl_WorkGroupID.x; h < p.heads; h += gl_NumWorkGroups.x) {
        uint v0 = p.q0 + h * p.d;
        if (lid == 0u) {
            precise double ss = 0.0LF;
            for (uint i = 0u; i < p.d; i++) {
                double vi = double(q[v0 + i]);
                ss += double(round_bf16(float(vi * vi)));
            }
            precise double m = double(round_bf16(float(ss / double(p.d))));
            precise double e = double(round_bf16(float(m + p.eps)));
            precise double r = double(round_bf16(float(1.0LF / sqrt(e))));
            s_r = r;
        }
        barrier();
        double r = s_r;
        for (uint i = lid; i < p.d; i += 64u) {
            precise double v = double(q[v0 + i]) * r;
            q[v0 + i] = round_bf16(float(v));
        }
        barrier();
    }
}
