// rope.comp - the op rope (backend.h): in place, the pairs (x[2i], x[2i+1]) of the last d_rope
// dims of each of a row's n_vec vectors rotated by the angle f32(pos[r] * freq[i]) (or its
// negative), cos and sin rounded to f32 as the reference takes them from libm in double
// (src/backend/cpu/ref_ops.c), the rotation in double, the result rounded to bf16. cos and
// sin come from dmath.glsl: a few double ulps from the true value, so they round to the
// reference's f32 except when the true value lies that close to an f32 rounding boundary.
// One invocation per (row, pair), over the row's vectors.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "dmath.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Pos { int pos[]; };
layout(std430, set = 0, binding = 1) readonly buffer F { float freq[]; };
layout(std430, set = 0, binding = 2) buffer X { float x[]; };
layout(push_constant) uniform P { uint pos0, f0, x0, n, n_vec, d_full, d_rope, inverse; } p;

void main()
{
    uint half_ = p.d_rope / 2u, total = p.n * half_, stride = gl_NumWorkGroups.x * 64u;
    for (uint k = gl_GlobalInvocationID.x; k < total; k += stride) {
        uint r = k / half_, i = k % half_;
        precise double ang = double(float(double(pos[p.pos0 + r]) * double(freq[p.f0 + i])));
        double sd, cd;
        dsincos(ang, sd, cd);
        double c = double(float(cd)), s = double(float(sd));
        if (p.inverse != 0u) s = -s;
        for (uint v = 0u; v < p.n_vec; v++) {
            uint e = p.x0 + (r * p.n_vec + v) * p.d_full + (p.d_full - p.d_rope) + 2u * i;
            double a = double(x[e]), b = double(x[e + 1u]);
            precise double y0 = a * c - b * s, y1 = a * s + b * c;
            x[e]      = round_bf16(float(y0));
            x[e + 1u] = round_bf16(float(y1));
        }
    }
}
