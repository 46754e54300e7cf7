// hadamard.comp - the op hadamard (backend.h): in place, x[r] = bf16(H_d x[r] / sqrt(d)), the
// Sylvester butterflies in double stage by stage (len = 1, 2, 4, ...) as the reference
// (src/backend/cpu/ref_ops.c), so every sum and difference is the reference's. One workgroup
// per row, the row in shared memory (d <= 4096: 32 KiB of doubles, the reference's limit too).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { uint x0, n, d; } p;

shared double v[4096];

void main()
{
    uint   lid   = gl_LocalInvocationID.x;
    double scale = 1.0LF / sqrt(double(p.d));
    for (uint r = gl_WorkGroupID.x; r < p.n; r += gl_NumWorkGroups.x) {
        uint xr = p.x0 + r * p.d;
        for (uint i = lid; i < p.d; i += 256u) v[i] = double(x[xr + i]);
        barrier();
        for (uint len = 1u; len < p.d; len *= 2u) {
            for (uint t = lid; t < p.d / 2u; t += 256u) {
                uint j = (t / len) * 2u * len + t % len;
                double a = v[j], b = v[j + len];
                precise double s = a + b, df = a - b;
                v[j] = s;
                v[j + len] = df;
            }
            barrier();
        }
        for (uint i = lid; i < p.d; i += 256u) {
            precise double y = v[i] * scale;
            x[xr + i] = round_bf16(float(y));
        }
        barrier();
    }
}
