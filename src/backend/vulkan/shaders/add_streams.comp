// add_streams.comp - the op add_streams (backend.h): X[r, c, i] = bf16(f32(X[r, c, i] + e[r, i]))
// for every stream c < hc, the sum in double as the reference. One invocation per element of X.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer E { float e[]; };
layout(std430, set = 0, binding = 1) buffer X { float x[]; };
layout(push_constant) uniform P { uint e0, x0, n, hc, d; } p;

void main()
{
    uint total = p.n * p.hc * p.d, stride = gl_NumWorkGroups.x * 256u;
    for (uint k = gl_GlobalInvocationID.x; k < total; k += stride) {
        uint r = k / (p.hc * p.d), i = k % p.d;
        precise double v = double(x[p.x0 + k]) + double(e[p.e0 + r * p.d + i]);
        x[p.x0 + k] = round_bf16(float(v));
    }
}
