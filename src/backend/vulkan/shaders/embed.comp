// embed.comp - the op embed (backend.h): X[r, c, i] = f32(table[tok[r], i]) for `copies`
// streams. The table is bf16, read as 32-bit words; X is written as bits (uint), so a NaN in the
// table arrives unchanged. One invocation per element of X.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer T { int tok[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint table[]; };
layout(std430, set = 0, binding = 2) buffer X { uint x[]; };
layout(push_constant) uniform P { uint tok0, tab0, x0, n, d, copies; } p;

void main()
{
    uint total = p.n * p.copies * p.d, stride = gl_NumWorkGroups.x * 256u;
    for (uint k = gl_GlobalInvocationID.x; k < total; k += stride) {
        uint r = k / (p.copies * p.d), i = k % p.d;
        uint h = p.tab0 + uint(tok[p.tok0 + r]) * p.d + i;
        uint w = table[h >> 1];
        x[p.x0 + k] = ((h & 1u) != 0u ? (w >> 16) : (w & 0xffffu)) << 16;
    }
}
