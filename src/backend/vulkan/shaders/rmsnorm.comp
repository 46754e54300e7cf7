// rmsnorm.comp - the op rmsnorm (backend.h): y[r, i] = bf16(w[i] * (x[r, i] * inv)) with
// inv = 1 / sqrt(f32(sum x^2 / d) + eps), in double as the reference (src/backend/cpu/ref_ops.c).
// One workgroup per row: its first invocation sums the squares in the reference's order (so
// the result is the reference's bit for bit, whatever the device); all of them then write the
// row. `precise` keeps the compiler from rewriting 1 / sqrt as an approximate rsqrt. A tree
// reduction in a fixed order is the faster next step. In place (x = y) is safe: the row is read
// whole before the barrier, and each invocation then reads and writes its own elements.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Xin { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform P { double eps; uint x0, w0, y0, n, d, ldx, ldy; } p;

shared double s_inv;

void main()
{
    uint lid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < p.n; r += gl_NumWorkGroups.x) {
        uint xr = p.x0 + r * p.ldx, yr = p.y0 + r * p.ldy;
        if (lid == 0u) {
            precise double ss = 0.0LF;
            for (uint i = 0u; i < p.d; i++) {
                double xi = double(x[xr + i]);
                ss += xi * xi;
            }
            precise double m = double(float(ss / double(p.d)));
            precise double inv = 1.0LF / sqrt(m + p.eps);
            s_inv = inv;
        }
        barrier();
        double inv = s_inv;
        for (uint i = lid; i < p.d; i += 64u) {
            precise double v = double(BF16_AT(w, p.w0 + i)) * (double(x[xr + i]) * inv);
            y[yr + i] = round_bf16(float(v));
        }
        barrier();
    }
}
